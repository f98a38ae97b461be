#include "dopt/optim/radam.hpp"

#include "param_step.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct RAdamScalars {
  T wd, beta1, one_minus_beta1, beta2, one_minus_beta2, bc1, lr, eps, bc2_sqrt, rect;
  bool has_wd, rectified;
  /// bc1, bc2: the moments' bias corrections; rect_: the rectification term
  /// (used when rectified_).
  RAdamScalars(const RAdamOptions& o, double bc1_, double bc2, double rect_, bool rectified_)
      : wd(sc<T>(o.weight_decay())), beta1(sc<T>(o.betas()[0])), one_minus_beta1(sc<T>(1.0 - o.betas()[0])),
        beta2(sc<T>(o.betas()[1])), one_minus_beta2(sc<T>(1.0 - o.betas()[1])), bc1(sc<T>(bc1_)), lr(sc<T>(o.lr())),
        eps(sc<T>(o.eps())), bc2_sqrt(sc<T>(std::sqrt(bc2))), rect(sc<T>(rect_)), has_wd(o.weight_decay() != 0.0),
        rectified(rectified_) {}

  /// One element (two_buffer_loop) of torch 1.13's single-tensor RAdam, the
  /// gradient g already g + wd * p; m, v as Adam's:
  ///   b = m / bc1                                      (exp_avg / bias_correction1)
  ///   Rect:       a = (1 / (sqrt(v) + eps)) * sqrt(bc2)   (python scalar / tensor)
  ///               p = p - ((b * lr) * a) * rect
  ///   otherwise:  p = p - b * lr
  template <bool Rect>
  DOPT_INLINE void element(T& p, T g, T& m, T& v) const {
    kernels::adam_moments(m, v, g, *this);
    const T b = m / bc1;
    T u;
    if constexpr (Rect) {
      const T a = (T(1) / (std::sqrt(v) + eps)) * bc2_sqrt;
      u = ((b * lr) * a) * rect;
    } else {
      u = b * lr;
    }
    p = p - u;
  }
};

template <class T>
DOPT_INLINE void radam_select(T* p, const T* g, T* m, T* v, i64 n, const RAdamScalars<T>& s) {
  if (s.has_wd) {
    if (s.rectified) two_buffer_loop<T, true, true>(p, g, m, v, n, s);
    else two_buffer_loop<T, true, false>(p, g, m, v, n, s);
  } else {
    if (s.rectified) two_buffer_loop<T, false, true>(p, g, m, v, n, s);
    else two_buffer_loop<T, false, false>(p, g, m, v, n, s);
  }
}

DOPT_KERNEL_ENTRY(radam_kernel, radam_select, (p, g, m, v, n, s), T* p, const T* g, T* m, T* v, i64 n,
                  const RAdamScalars<T>& s)

}  // namespace
}  // namespace kernels

constexpr detail::StateLayout<2> kRAdamState{DType::float32, {"exp_avg", "exp_avg_sq"}};

void RAdam::update_param(const RAdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "RAdam.step";
  detail::require_cpu_param(p, op, "RAdam");
  const auto step = kRAdamState.begin(op, p, g, st);
  const double s = step.step;
  const double beta1 = o.betas()[0], beta2 = o.betas()[1];
  const double bc1 = step.bias_correction(beta1);
  const double bc2 = step.bias_correction(beta2);
  // The length of the approximated simple moving average, and its limit.
  const double rho_inf = 2.0 / (1.0 - beta2) - 1.0;
  const double rho_t = rho_inf - 2.0 * s * std::pow(beta2, s) / bc2;
  const bool rectified = rho_t > 5.0;
  const double rect =
      rectified ? std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
                : 0.0;
  step.run<kernels::RAdamScalars>(kernels::radam_kernel, o, bc1, bc2, rect, rectified);
}

void RAdam::init_param_state(const RAdamOptions& /*o*/, const Tensor& p, ParamState& st) {
  kRAdamState.init(p, st);
}

}  // namespace dopt::optim
