#include "dopt/optim/sgd.hpp"

#include "kernel_support.hpp"

namespace dopt::optim {

void SGDOptions::validate(const std::string& op) const {
  OptionsCRTP::validate(op);
  if (nesterov_ && (momentum_ <= 0.0 || dampening_ != 0.0))
    throw ValueError(op, "Nesterov momentum requires a momentum and zero dampening");
}

namespace kernels {
namespace {

template <class T>
struct SGDScalars {
  T gsign, wd, momentum, one_minus_dampening, neg_lr;
  bool has_wd, nesterov;
  int mom_mode;  // 0 no momentum, 1 first momentum step (buf = d), 2 running buffer
  SGDScalars(const SGDOptions& o, int mom_mode_)
      : gsign(o.maximize() ? T(-1) : T(1)), wd(sc<T>(o.weight_decay())), momentum(sc<T>(o.momentum())),
        one_minus_dampening(sc<T>(1.0 - o.dampening())), neg_lr(sc<T>(-o.lr())), has_wd(o.weight_decay() != 0.0),
        nesterov(o.nesterov()), mom_mode(mom_mode_) {}
};

// Loop-shape options are template parameters (no control flow in the loop, so
// GCC vectorises it); maximize is an exact multiplication by -1.
template <class T, int MomMode, bool Nesterov, bool Wd>
inline __attribute__((always_inline)) void sgd_body(T* __restrict p, const T* __restrict g, T* __restrict buf,
                                                    i64 n, const SGDScalars<T>& s) {
  // Without momentum buf is null: p stands in for it in the prefetch list.
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, (MomMode != 0 ? buf : p)) {
    const T pi = p[i];
    T d = g[i] * s.gsign;
    if constexpr (Wd) d = std::fma(s.wd, pi, d);
    if constexpr (MomMode != 0) {
      T b;
      if constexpr (MomMode == 1) {
        b = d;
      } else {
        b = buf[i] * s.momentum;
        b = std::fma(s.one_minus_dampening, d, b);
      }
      buf[i] = b;
      if constexpr (Nesterov) d = std::fma(s.momentum, b, d);
      else d = b;
    }
    p[i] = std::fma(s.neg_lr, d, pi);
  }
}

template <class T, int MomMode, bool Nesterov>
inline __attribute__((always_inline)) void sgd_select_wd(T* p, const T* g, T* buf, i64 n, const SGDScalars<T>& s) {
  if (s.has_wd) sgd_body<T, MomMode, Nesterov, true>(p, g, buf, n, s);
  else sgd_body<T, MomMode, Nesterov, false>(p, g, buf, n, s);
}

template <class T>
inline __attribute__((always_inline)) void sgd_select(T* p, const T* g, T* buf, i64 n, const SGDScalars<T>& s) {
  switch (s.mom_mode) {
    case 0: sgd_select_wd<T, 0, false>(p, g, buf, n, s); return;
    case 1:
      if (s.nesterov) sgd_select_wd<T, 1, true>(p, g, buf, n, s);
      else sgd_select_wd<T, 1, false>(p, g, buf, n, s);
      return;
    default:
      if (s.nesterov) sgd_select_wd<T, 2, true>(p, g, buf, n, s);
      else sgd_select_wd<T, 2, false>(p, g, buf, n, s);
      return;
  }
}

DOPT_KERNEL_ENTRY(sgd_kernel, sgd_select, (p, g, buf, n, s), T* p, const T* g, T* buf, i64 n, const SGDScalars<T>& s)

}  // namespace
}  // namespace kernels

void SGD::init_param_state(const SGDOptions& /*o*/, const Tensor& /*p*/, ParamState& /*st*/) {
  // Nothing up front: the momentum buffer is created by the first momentum step.
}

void SGD::update_param(const SGDOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "SGD.step";
  const bool has_momentum = o.momentum() != 0.0;
  int mom_mode = 0;
  Tensor buf;
  if (has_momentum) {
    auto it = st.find("momentum_buffer");
    if (it == st.end() || !it->second.defined()) {
      buf = Tensor::empty(p.shape(), p.dtype(), p.device());
      mom_mode = 1;
    } else {
      buf = it->second;
      if (buf.shape() != p.shape() || buf.dtype() != p.dtype())
        throw StateError(op, "momentum_buffer " + buf.str() + " does not match parameter " + p.str());
      mom_mode = 2;
    }
  }
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    kernels::sgd_kernel(p.data<T>(), g.data<T>(), has_momentum ? buf.template data<T>() : nullptr, p.numel(),
                        kernels::SGDScalars<T>(o, mom_mode));
  });
  if (mom_mode == 1) st["momentum_buffer"] = buf;
}

}  // namespace dopt::optim
