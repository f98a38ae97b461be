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
};

// No control flow in the loop (vectorises): weight decay is a template flag,
// maximize an exact multiplication by -1, the NaN-propagating max a select.
template <class T, bool Wd>
DOPT_INLINE void adamax_body(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict u, i64 n,
                             const AdamaxScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, m, u) {
    const T pi = p[i];
    const T gi = kernels::decayed_grad<Wd>(g[i], pi, s);
    T mi = m[i] * s.beta1;
    mi = std::fma(s.one_minus_beta1, gi, mi);
    const T a = u[i] * s.beta2;
    const T b = std::fabs(gi) + s.eps;
    // torch.amax propagates NaN: a when a > b or a is NaN, else b (which is
    // then NaN if b is).
    const T ui = (a > b || a != a) ? a : b;
    p[i] = pi + (s.neg_clr * mi) / ui;
    m[i] = mi;
    u[i] = ui;
  }
}

DOPT_KERNEL_ENTRY_FLAG(adamax_kernel, adamax_body, s.has_wd, (p, g, m, u, n, s), T* p, const T* g, T* m, T* u, i64 n,
                       const AdamaxScalars<T>& s)

}  // namespace
}  // namespace kernels

constexpr detail::StateLayout<2> kAdamaxState{DType::float32, {"exp_avg", "exp_inf"}};

void Adamax::update_param(const AdamaxOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const auto step = kAdamaxState.begin("Adamax.step", p, g, st);
  const double clr = o.lr() / (1.0 - std::pow(o.betas()[0], step.step));
  step.run<kernels::AdamaxScalars>(kernels::adamax_kernel, o, clr);
}

void Adamax::init_param_state(const AdamaxOptions& /*o*/, const Tensor& p, ParamState& st) {
  kAdamaxState.init(p, st);
}

}  // namespace dopt::optim
