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

  /// One element (two_buffer_loop, no weight decay): g the gradient times
  /// gsign (maximize: an exact * -1), prev the previous effective gradient,
  /// ss the step size. The selects compile to blends. Follows torch's tensor ops:
  ///   sign = (g*prev).sign(); sign[sign>0] = eta+; sign[sign<0] = eta-; sign[sign==0] = 1
  ///   step_size.mul_(sign).clamp_(min, max); g[sign == eta-] = 0
  ///   p.addcmul_(g.sign(), step_size, value=-1); prev.copy_(g)
  DOPT_INLINE void element(T& p, T g, T& prev, T& ss) const {
    const T ep = etaplus, em = etaminus, lo = step_min, hi = step_max;  // unconditional loads
    const T prod = g * prev;  // NaN compares false both ways: factor 1
    // The factor, assigned in torch's order (eta+ where > 0, eta- where < 0, else 1).
    T f = prod > T(0) ? ep : T(1);
    f = prod < T(0) ? em : f;
    T si = ss * f;
    si = si < lo ? lo : si;  // clamp = min(max(x, lo), hi), NaN propagates
    si = si > hi ? hi : si;
    const T ge = f == em ? T(0) : g;
    T sgn = ge > T(0) ? T(1) : T(0);  // torch.sign: 0 for +-0 and NaN
    sgn = ge < T(0) ? T(-1) : sgn;
    p = std::fma(T(-1) * sgn, si, p);
    ss = si;
    prev = ge;
  }
};

DOPT_KERNEL_ENTRY(rprop_kernel, (two_buffer_loop<T, false>), (p, g, prev, ss, n, s), T* p, const T* g, T* prev, T* ss,
                  i64 n, const RpropScalars<T>& s)

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
