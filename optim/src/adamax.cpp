#include "dopt/optim/adamax.hpp"

#include "param_step.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct AdamaxScalars {
  T gsign, wd, beta1, one_minus_beta1, beta2, eps, neg_clr;
  bool has_wd;
  /// clr: the bias-corrected learning rate of this step.
  AdamaxScalars(const AdamaxOptions& o, double clr)
      : gsign(o.maximize() ? T(-1) : T(1)), wd(sc<T>(o.weight_decay())), beta1(sc<T>(o.betas()[0])),
        one_minus_beta1(sc<T>(1.0 - o.betas()[0])), beta2(sc<T>(o.betas()[1])), eps(sc<T>(o.eps())),
        neg_clr(sc<T>(-clr)), has_wd(o.weight_decay() != 0.0) {}

  /// One element (two_buffer_loop): m the first moment, u the infinity norm.
  /// maximize is an exact multiplication by -1, the NaN-propagating max a select.
  DOPT_INLINE void element(T& p, T g, T& m, T& u) const {
    m = std::fma(one_minus_beta1, g, m * beta1);
    const T a = u * beta2;
    const T b = std::fabs(g) + eps;
    // torch.amax propagates NaN: a when a > b or a is NaN, else b (which is
    // then NaN if b is).
    u = (a > b || a != a) ? a : b;
    p = p + (neg_clr * m) / u;
  }
};

DOPT_TWO_BUFFER_KERNEL(adamax_kernel, AdamaxScalars)

}  // namespace
}  // namespace kernels

constexpr detail::StateLayout<2> kAdamaxState{DType::float32, {"exp_avg", "exp_inf"}};

void Adamax::update_param(const AdamaxOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const auto step = kAdamaxState.begin("Adamax.step", p, g, st);
  const double clr = o.lr() / step.bias_correction(o.betas()[0]);
  step.run<kernels::AdamaxScalars>(kernels::adamax_kernel, o, clr);
}

void Adamax::init_param_state(const AdamaxOptions& /*o*/, const Tensor& p, ParamState& st) {
  kAdamaxState.init(p, st);
}

}  // namespace dopt::optim
