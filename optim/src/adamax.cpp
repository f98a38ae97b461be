#include "dopt/optim/adamax.hpp"

#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct AdamaxScalars {
  T gsign, wd, beta1, one_minus_beta1, beta2, eps, neg_clr;
};

// No control flow in the loop (vectorises): weight decay is a template flag,
// maximize an exact multiplication by -1, the NaN-propagating max a select.
template <class T, bool Wd>
DOPT_INLINE void adamax_body(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict u, i64 n,
                             const AdamaxScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, m, u) {
    const T pi = p[i];
    T gi = g[i] * s.gsign;
    if constexpr (Wd) gi = std::fma(s.wd, pi, gi);
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

#define DOPT_ADAMAX_PARAMS(T) T* p, const T* g, T* m, T* u, i64 n, const AdamaxScalars<T>& s
DOPT_KERNEL_ENTRY_FLAG(adamax_kernel, adamax_body, DOPT_ADAMAX_PARAMS, (p, g, m, u, n, s))
#undef DOPT_ADAMAX_PARAMS

}  // namespace
}  // namespace kernels

void Adamax::init_param_state(const AdamaxOptions& /*o*/, const Tensor& p, ParamState& st) {
  detail::init_step_and_zeros(st, p, DType::float32, {"exp_avg", "exp_inf"});
}

void Adamax::update_param(const AdamaxOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "Adamax.step";
  Tensor& step_t = detail::state_at(st, "step", op);
  Tensor& m = detail::matching_state_at(st, "exp_avg", p, op);
  Tensor& u = detail::matching_state_at(st, "exp_inf", p, op);
  const double s = detail::increment_step(step_t);
  const double beta1 = o.betas()[0], beta2 = o.betas()[1];
  const double clr = o.lr() / (1.0 - std::pow(beta1, s));
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    using kernels::sc;
    kernels::AdamaxScalars<T> k{o.maximize() ? T(-1) : T(1), sc<T>(o.weight_decay()), sc<T>(beta1),
                                sc<T>(1.0 - beta1),           sc<T>(beta2),            sc<T>(o.eps()),
                                sc<T>(-clr)};
    kernels::adamax_kernel(p.data<T>(), g.data<T>(), m.template data<T>(), u.template data<T>(), p.numel(), k,
                           o.weight_decay() != 0.0);
  });
}

}  // namespace dopt::optim
