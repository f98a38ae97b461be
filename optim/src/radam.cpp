#include "dopt/optim/radam.hpp"

#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct RAdamScalars {
  T wd, beta1, one_minus_beta1, beta2, one_minus_beta2, bc1, lr, eps, bc2_sqrt, rect;
};

// torch 1.13's single-tensor RAdam, one pass (no control flow in the loop):
//   g = g + wd * p; m, v as Adam's
//   b = m / bc1                                      (exp_avg / bias_correction1)
//   rectified:  a = (1 / (sqrt(v) + eps)) * sqrt(bc2)   (python scalar / tensor)
//               p = p - ((b * lr) * a) * rect
//   otherwise:  p = p - b * lr
template <class T, bool Wd, bool Rect>
DOPT_INLINE void radam_body(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, i64 n,
                            const RAdamScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, m, v) {
    const T pi = p[i];
    T gi = g[i];
    if constexpr (Wd) gi = std::fma(s.wd, pi, gi);
    T mi = m[i], vi = v[i];
    kernels::adam_moments(mi, vi, gi, s);
    const T b = mi / s.bc1;
    T u;
    if constexpr (Rect) {
      const T a = (T(1) / (std::sqrt(vi) + s.eps)) * s.bc2_sqrt;
      u = ((b * s.lr) * a) * s.rect;
    } else {
      u = b * s.lr;
    }
    p[i] = pi - u;
    m[i] = mi;
    v[i] = vi;
  }
}

template <class T>
DOPT_INLINE void radam_select(T* p, const T* g, T* m, T* v, i64 n, const RAdamScalars<T>& s, bool wd, bool rect) {
  if (wd) {
    if (rect) radam_body<T, true, true>(p, g, m, v, n, s);
    else radam_body<T, true, false>(p, g, m, v, n, s);
  } else {
    if (rect) radam_body<T, false, true>(p, g, m, v, n, s);
    else radam_body<T, false, false>(p, g, m, v, n, s);
  }
}

#define DOPT_RADAM_PARAMS(T) T* p, const T* g, T* m, T* v, i64 n, const RAdamScalars<T>& s, bool wd, bool rect
DOPT_KERNEL_ENTRY(radam_kernel, radam_select, DOPT_RADAM_PARAMS, (p, g, m, v, n, s, wd, rect))
#undef DOPT_RADAM_PARAMS

}  // namespace
}  // namespace kernels

void RAdam::init_param_state(const RAdamOptions& /*o*/, const Tensor& p, ParamState& st) {
  detail::init_step_and_zeros(st, p, DType::float32, {"exp_avg", "exp_avg_sq"});
}

void RAdam::update_param(const RAdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "RAdam.step";
  detail::require_cpu_param(p, op, "RAdam");
  Tensor& step_t = detail::state_at(st, "step", op);
  Tensor& m = detail::matching_state_at(st, "exp_avg", p, op);
  Tensor& v = detail::matching_state_at(st, "exp_avg_sq", p, op);
  const double s = detail::check_kernel_then_increment(p, step_t, op);
  const double beta1 = o.betas()[0], beta2 = o.betas()[1];
  const double bc1 = 1.0 - std::pow(beta1, s);
  const double bc2 = 1.0 - std::pow(beta2, s);
  // The length of the approximated simple moving average, and its limit.
  const double rho_inf = 2.0 / (1.0 - beta2) - 1.0;
  const double rho_t = rho_inf - 2.0 * s * std::pow(beta2, s) / bc2;
  const bool rectified = rho_t > 5.0;
  const double rect =
      rectified ? std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
                : 0.0;
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    using kernels::sc;
    kernels::RAdamScalars<T> k{sc<T>(o.weight_decay()), sc<T>(beta1), sc<T>(1.0 - beta1), sc<T>(beta2),
                               sc<T>(1.0 - beta2),      sc<T>(bc1),   sc<T>(o.lr()),      sc<T>(o.eps()),
                               sc<T>(std::sqrt(bc2)),   sc<T>(rect)};
    kernels::radam_kernel(p.data<T>(), g.data<T>(), m.template data<T>(), v.template data<T>(), p.numel(), k,
                          o.weight_decay() != 0.0, rectified);
  });
}

}  // namespace dopt::optim
