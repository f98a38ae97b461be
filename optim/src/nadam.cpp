#include "dopt/optim/nadam.hpp"

#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct NAdamScalars {
  T wd, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2, eps, grad_coef, avg_coef;
};

// torch 1.13's single-tensor NAdam, one pass (no control flow in the loop):
//   g = g + wd * p                       (grad.add(p, alpha=wd): one FMA)
//   m = m * beta1; m = m + (1 - beta1) * g          (mul_, add_ with alpha: FMA)
//   v = v * beta2; v = v + ((1 - beta2) * g) * g    (mul_, addcmul_: FMA)
//   d = sqrt(v / bc2) + eps                          (div, sqrt, add_)
//   p = p + (grad_coef * g) / d; p = p + (avg_coef * m) / d   (two addcdiv_)
template <class T, bool Wd>
DOPT_INLINE void nadam_body(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, i64 n,
                            const NAdamScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, m, v) {
    T pi = p[i];
    T gi = g[i];
    if constexpr (Wd) gi = std::fma(s.wd, pi, gi);
    T mi = m[i], vi = v[i];
    kernels::adam_moments(mi, vi, gi, s);
    const T denom = std::sqrt(vi / s.bc2) + s.eps;
    pi = pi + (s.grad_coef * gi) / denom;
    pi = pi + (s.avg_coef * mi) / denom;
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

#define DOPT_NADAM_PARAMS(T) T* p, const T* g, T* m, T* v, i64 n, const NAdamScalars<T>& s
DOPT_KERNEL_ENTRY_FLAG(nadam_kernel, nadam_body, DOPT_NADAM_PARAMS, (p, g, m, v, n, s))
#undef DOPT_NADAM_PARAMS

}  // namespace
}  // namespace kernels

void NAdam::init_param_state(const NAdamOptions& /*o*/, const Tensor& p, ParamState& st) {
  detail::init_step_and_zeros(st, p, DType::float32, {"exp_avg", "exp_avg_sq"});
  st["mu_product"] = Tensor::scalar(1.0, DType::float32);
}

void NAdam::update_param(const NAdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "NAdam.step";
  detail::require_cpu_param(p, op, "NAdam");
  // Look everything up before changing anything: a bad state leaves it untouched.
  Tensor& step_t = detail::state_at(st, "step", op);
  Tensor& mu_product_t = detail::state_at(st, "mu_product", op);
  if (mu_product_t.dim() != 0) throw StateError(op, "state 'mu_product' must be a 0-d tensor, got " + mu_product_t.str());
  Tensor& m = detail::matching_state_at(st, "exp_avg", p, op);
  Tensor& v = detail::matching_state_at(st, "exp_avg_sq", p, op);
  const double s = detail::check_kernel_then_increment(p, step_t, op);
  const double beta1 = o.betas()[0], beta2 = o.betas()[1];
  const double bc2 = 1.0 - std::pow(beta2, s);
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
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    using kernels::sc;
    kernels::NAdamScalars<T> k{sc<T>(o.weight_decay()), sc<T>(beta1), sc<T>(1.0 - beta1),
                               sc<T>(beta2),            sc<T>(1.0 - beta2), sc<T>(bc2),
                               sc<T>(o.eps()),          sc<T>(grad_coef),   sc<T>(avg_coef)};
    kernels::nadam_kernel(p.data<T>(), g.data<T>(), m.template data<T>(), v.template data<T>(), p.numel(), k,
                          o.weight_decay() != 0.0);
  });
}

}  // namespace dopt::optim
