#include "dopt/optim/rmsprop.hpp"

#include "param_step.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct RMSpropScalars {
  T gsign, wd, alpha, one_minus_alpha, eps, momentum, neg_lr;
  bool has_wd, centered, has_momentum;
  explicit RMSpropScalars(const RMSpropOptions& o)
      : gsign(o.maximize() ? T(-1) : T(1)), wd(sc<T>(o.weight_decay())), alpha(sc<T>(o.alpha())),
        one_minus_alpha(sc<T>(1.0 - o.alpha())), eps(sc<T>(o.eps())), momentum(sc<T>(o.momentum())),
        neg_lr(sc<T>(-o.lr())), has_wd(o.weight_decay() != 0.0), centered(o.centered()),
        has_momentum(o.momentum() > 0.0) {}
};

// No control flow in the loop (vectorises); maximize is an exact * -1.
template <class T, bool Wd, bool Centered, bool Momentum>
inline __attribute__((always_inline)) void rmsprop_body(T* __restrict p, const T* __restrict g, T* __restrict sq,
                                                        T* __restrict ga, T* __restrict buf, i64 n,
                                                        const RMSpropScalars<T>& s) {
  // Null streams (no grad_avg / momentum_buffer) are replaced by p in the prefetch list.
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, sq, (Centered ? ga : p), (Momentum ? buf : p)) {
    const T pi = p[i];
    const T gi = kernels::decayed_grad<Wd>(g[i], pi, s);
    T sqi = sq[i] * s.alpha;
    sqi = std::fma(s.one_minus_alpha * gi, gi, sqi);
    sq[i] = sqi;
    T avg;
    if constexpr (Centered) {
      T gai = ga[i] * s.alpha;
      gai = std::fma(s.one_minus_alpha, gi, gai);
      ga[i] = gai;
      avg = std::sqrt(std::fma(-gai, gai, sqi));
    } else {
      avg = std::sqrt(sqi);
    }
    avg = avg + s.eps;
    if constexpr (Momentum) {
      T b = buf[i] * s.momentum;
      b = b + gi / avg;
      buf[i] = b;
      p[i] = std::fma(s.neg_lr, b, pi);
    } else {
      p[i] = pi + (s.neg_lr * gi) / avg;
    }
  }
}

template <class T, bool Wd>
inline __attribute__((always_inline)) void rmsprop_select2(T* p, const T* g, T* sq, T* ga, T* buf, i64 n,
                                                           const RMSpropScalars<T>& s) {
  if (s.centered) {
    if (s.has_momentum) rmsprop_body<T, Wd, true, true>(p, g, sq, ga, buf, n, s);
    else rmsprop_body<T, Wd, true, false>(p, g, sq, ga, buf, n, s);
  } else {
    if (s.has_momentum) rmsprop_body<T, Wd, false, true>(p, g, sq, ga, buf, n, s);
    else rmsprop_body<T, Wd, false, false>(p, g, sq, ga, buf, n, s);
  }
}

template <class T>
inline __attribute__((always_inline)) void rmsprop_select(T* p, const T* g, T* sq, T* ga, T* buf, i64 n,
                                                          const RMSpropScalars<T>& s) {
  if (s.has_wd) rmsprop_select2<T, true>(p, g, sq, ga, buf, n, s);
  else rmsprop_select2<T, false>(p, g, sq, ga, buf, n, s);
}

DOPT_KERNEL_ENTRY(rmsprop_kernel, rmsprop_select, (p, g, sq, ga, buf, n, s), T* p, const T* g, T* sq, T* ga, T* buf,
                  i64 n, const RMSpropScalars<T>& s)

}  // namespace
}  // namespace kernels

// `step` counts as torch's Python int (the math does not use it);
// grad_avg only when centered, momentum_buffer only with momentum > 0.
constexpr detail::StateLayout<3> kRMSpropState{DType::int64, {"square_avg", "grad_avg", "momentum_buffer"}};

void RMSprop::update_param(const RMSpropOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "RMSprop.step";
  const bool has_momentum = o.momentum() > 0.0;
  if (has_momentum && !st.count("momentum_buffer"))
    throw StateError(op, "momentum was enabled after the state of this parameter was created (no "
                         "'momentum_buffer'; torch raises KeyError here)");
  if (o.centered() && !st.count("grad_avg"))
    throw StateError(op, "centered was enabled after the state of this parameter was created (no "
                         "'grad_avg'; torch raises KeyError here)");
  kRMSpropState.begin(op, p, g, st, {true, o.centered(), has_momentum})
      .run<kernels::RMSpropScalars>(kernels::rmsprop_kernel, o);
}

void RMSprop::init_param_state(const RMSpropOptions& o, const Tensor& p, ParamState& st) {
  kRMSpropState.init(p, st, {true, o.centered(), o.momentum() > 0.0});
}

}  // namespace dopt::optim
