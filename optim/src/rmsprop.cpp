#include "dopt/optim/rmsprop.hpp"

#include "kernel_support.hpp"
#include "optim_extra.hpp"
#include "optim_util.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct RMSpropScalars {
  T gsign, wd, alpha, one_minus_alpha, eps, momentum, neg_lr;
  bool has_wd, centered, has_momentum;
};

// No control flow in the loop (vectorises); maximize is an exact * -1.
template <class T, bool Wd, bool Centered, bool Momentum>
inline __attribute__((always_inline)) void rmsprop_body(T* __restrict p, const T* __restrict g, T* __restrict sq,
                                                        T* __restrict ga, T* __restrict buf, i64 n,
                                                        const RMSpropScalars<T>& s) {
  // Null streams (no grad_avg / momentum_buffer) are replaced by p in the prefetch list.
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, sq, (Centered ? ga : p), (Momentum ? buf : p)) {
    const T pi = p[i];
    T gi = g[i] * s.gsign;
    if constexpr (Wd) gi = std::fma(s.wd, pi, gi);
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

#define DOPT_RMSPROP_PARAMS(T) T* p, const T* g, T* sq, T* ga, T* buf, i64 n, const RMSpropScalars<T>& s
DOPT_KERNEL_ENTRY(rmsprop_kernel, rmsprop_select, DOPT_RMSPROP_PARAMS, (p, g, sq, ga, buf, n, s))
#undef DOPT_RMSPROP_PARAMS

}  // namespace
}  // namespace kernels

void RMSprop::init_param_state(const RMSpropOptions& o, const Tensor& p, ParamState& st) {
  detail::init_step_and_zeros(st, p, DType::int64, {"square_avg"});
  if (o.momentum() > 0.0) st["momentum_buffer"] = Tensor::zeros(p.shape(), p.dtype(), p.device());
  if (o.centered()) st["grad_avg"] = Tensor::zeros(p.shape(), p.dtype(), p.device());
}

void RMSprop::update_param(const RMSpropOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "RMSprop.step";
  const bool has_momentum = o.momentum() > 0.0;
  if (has_momentum && !st.count("momentum_buffer"))
    throw StateError(op, "momentum was enabled after the state of this parameter was created (no "
                         "'momentum_buffer'; torch raises KeyError here)");
  if (o.centered() && !st.count("grad_avg"))
    throw StateError(op, "centered was enabled after the state of this parameter was created (no "
                         "'grad_avg'; torch raises KeyError here)");
  Tensor& step_t = detail::state_at(st, "step", op);
  Tensor& sq = detail::matching_state_at(st, "square_avg", p, op);
  Tensor* ga = o.centered() ? &detail::matching_state_at(st, "grad_avg", p, op) : nullptr;
  Tensor* buf = has_momentum ? &detail::matching_state_at(st, "momentum_buffer", p, op) : nullptr;
  detail::increment_step(step_t);
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    using kernels::sc;
    kernels::RMSpropScalars<T> k{o.maximize() ? T(-1) : T(1),
                                 sc<T>(o.weight_decay()),
                                 sc<T>(o.alpha()),
                                 sc<T>(1.0 - o.alpha()),
                                 sc<T>(o.eps()),
                                 sc<T>(o.momentum()),
                                 sc<T>(-o.lr()),
                                 o.weight_decay() != 0.0,
                                 o.centered(),
                                 has_momentum};
    kernels::rmsprop_kernel(p.data<T>(), g.data<T>(), sq.template data<T>(),
                            ga ? ga->template data<T>() : nullptr, buf ? buf->template data<T>() : nullptr,
                            p.numel(), k);
  });
}

}  // namespace dopt::optim
