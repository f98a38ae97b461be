#include "dopt/optim/nadam.hpp"

#include "param_step.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct NAdamScalars {
  T wd, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2, eps, grad_coef, avg_coef;
  bool has_wd;
  /// bc2: the second moment's bias correction; grad_coef, avg_coef: the
  /// factors of the two addcdiv_ of this step.
  NAdamScalars(const NAdamOptions& o, double bc2_, double grad_coef_, double avg_coef_)
      : wd(sc<T>(o.weight_decay())), beta1(sc<T>(o.betas()[0])), one_minus_beta1(sc<T>(1.0 - o.betas()[0])),
        beta2(sc<T>(o.betas()[1])), one_minus_beta2(sc<T>(1.0 - o.betas()[1])), bc2(sc<T>(bc2_)), eps(sc<T>(o.eps())),
        grad_coef(sc<T>(grad_coef_)), avg_coef(sc<T>(avg_coef_)), has_wd(o.weight_decay() != 0.0) {}

  /// One element (two_buffer_loop) of torch 1.13's single-tensor NAdam, the
  /// gradient g already g + wd * p (grad.add(p, alpha=wd): one FMA):
  ///   m = m * beta1; m = m + (1 - beta1) * g          (mul_, add_ with alpha: FMA)
  ///   v = v * beta2; v = v + ((1 - beta2) * g) * g    (mul_, addcmul_: FMA)
  ///   d = sqrt(v / bc2) + eps                          (div, sqrt, add_)
  ///   p = p + (grad_coef * g) / d; p = p + (avg_coef * m) / d   (two addcdiv_)
  DOPT_INLINE void element(T& p, T g, T& m, T& v) const {
    kernels::adam_moments(m, v, g, *this);
    const T denom = std::sqrt(v / bc2) + eps;
    p = p + (grad_coef * g) / denom;
    p = p + (avg_coef * m) / denom;
  }
};

DOPT_TWO_BUFFER_KERNEL(nadam_kernel, NAdamScalars)

}  // namespace
}  // namespace kernels

constexpr detail::StateLayout<2> kNAdamState{DType::float32, {"exp_avg", "exp_avg_sq"}};

void NAdam::update_param(const NAdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "NAdam.step";
  detail::require_cpu_param(p, op, "NAdam");
  // Look everything up before changing anything: a bad state leaves it untouched.
  Tensor& mu_product_t = detail::state_at(st, "mu_product", op);
  if (mu_product_t.dim() != 0) throw StateError(op, "state 'mu_product' must be a 0-d tensor, got " + mu_product_t.str());
  const auto step = kNAdamState.begin(op, p, g, st);
  const double s = step.step;
  const double beta1 = o.betas()[0], beta2 = o.betas()[1];
  const double bc2 = step.bias_correction(beta2);
  const double mu = beta1 * (1.0 - 0.5 * std::pow(0.96, s * o.momentum_decay()));
  const double mu_next = beta1 * (1.0 - 0.5 * std::pow(0.96, (s + 1.0) * o.momentum_decay()));
  // torch keeps mu_product as a float32 0-d tensor: `mu_product *= mu`, then
  // `mu_product * mu * mu_next` with the already updated product (mu enters
  // twice; that is torch 1.13's single-tensor code), each product in float32.
  const float mu_product = static_cast<float>(mu_product_t.item()) * static_cast<float>(mu);
  const float mu_product_next = (mu_product * static_cast<float>(mu)) * static_cast<float>(mu_next);
  mu_product_t.fill_(static_cast<double>(mu_product));
  const double grad_coef = -o.lr() * (1.0 - mu) / (1.0 - static_cast<double>(mu_product));
  const double avg_coef = -o.lr() * mu_next / (1.0 - static_cast<double>(mu_product_next));
  step.run<kernels::NAdamScalars>(kernels::nadam_kernel, o, bc2, grad_coef, avg_coef);
}

void NAdam::init_param_state(const NAdamOptions& /*o*/, const Tensor& p, ParamState& st) {
  kNAdamState.init(p, st);
  st["mu_product"] = Tensor::scalar(1.0, DType::float32);
}

}  // namespace dopt::optim
