#include "dopt/optim/rprop.hpp"

#include "param_step.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct RpropScalars {
  T gsign, etaplus, etaminus, step_min, step_max;
  explicit RpropScalars(const RpropOptions& o)
      : gsign(o.maximize() ? T(-1) : T(1)), etaplus(sc<T>(o.etas()[1])), etaminus(sc<T>(o.etas()[0])),
        step_min(sc<T>(o.step_sizes()[0])), step_max(sc<T>(o.step_sizes()[1])) {}
};

// No control flow in the loop (the selects compile to blends, so it
// vectorises); maximize is an exact * -1. Follows torch's tensor ops:
//   sign = (g*prev).sign(); sign[sign>0] = eta+; sign[sign<0] = eta-; sign[sign==0] = 1
//   step_size.mul_(sign).clamp_(min, max); g[sign == eta-] = 0
//   p.addcmul_(g.sign(), step_size, value=-1); prev.copy_(g)
template <class T>
DOPT_INLINE void rprop_body(T* __restrict p, const T* __restrict g, T* __restrict prev, T* __restrict ss, i64 n,
                            const RpropScalars<T>& s) {
  // Scalars in locals: a select between a value loaded from `s` and another
  // is a conditional load, which GCC does not if-convert (no vectorisation).
  const T gsign = s.gsign, etaplus = s.etaplus, etaminus = s.etaminus, lo = s.step_min, hi = s.step_max;
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, prev, ss) {
    const T gi = g[i] * gsign;
    const T prod = gi * prev[i];  // NaN compares false both ways: factor 1
    // The factor, assigned in torch's order (eta+ where > 0, eta- where < 0, else 1).
    T f = prod > T(0) ? etaplus : T(1);
    f = prod < T(0) ? etaminus : f;
    T si = ss[i] * f;
    si = si < lo ? lo : si;  // clamp = min(max(x, lo), hi), NaN propagates
    si = si > hi ? hi : si;
    const T ge = f == etaminus ? T(0) : gi;
    T sgn = ge > T(0) ? T(1) : T(0);  // torch.sign: 0 for +-0 and NaN
    sgn = ge < T(0) ? T(-1) : sgn;
    p[i] = std::fma(T(-1) * sgn, si, p[i]);
    ss[i] = si;
    prev[i] = ge;
  }
}

DOPT_KERNEL_ENTRY(rprop_kernel, rprop_body, (p, g, prev, ss, n, s), T* p, const T* g, T* prev, T* ss, i64 n,
                  const RpropScalars<T>& s)

}  // namespace
}  // namespace kernels

// `step` counts as torch's Python int; the math does not use it. step_size
// starts full of the group's lr (not zeros).
constexpr detail::StateLayout<2> kRpropState{DType::int64, {"prev", "step_size"}};

void Rprop::update_param(const RpropOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  kRpropState.begin("Rprop.step", p, g, st).run<kernels::RpropScalars>(kernels::rprop_kernel, o);
}

void Rprop::init_param_state(const RpropOptions& o, const Tensor& p, ParamState& st) {
  kRpropState.init(p, st, {true, false});
  st["step_size"] = Tensor::full(p.shape(), o.lr(), p.dtype(), p.device());
}

}  // namespace dopt::optim
