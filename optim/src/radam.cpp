#include "dopt/optim/radam.hpp"

#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {

Hyperparams RAdamOptions::to_hyperparams() const {
  return {{"lr", lr_}, {"betas", detail::from_pair(betas_)}, {"eps", eps_}, {"weight_decay", weight_decay_}};
}

void RAdamOptions::set_hyperparams(const Hyperparams& h) {
  const char* op = "RAdamOptions";
  detail::check_known_keys(h, {"lr", "betas", "eps", "weight_decay"}, op);
  if (h.count("lr")) lr_ = hyper_number(h, "lr", op);
  if (h.count("betas")) betas_ = detail::to_pair(hyper_pair(h, "betas", op));
  if (h.count("eps")) eps_ = hyper_number(h, "eps", op);
  if (h.count("weight_decay")) weight_decay_ = hyper_number(h, "weight_decay", op);
}

void RAdamOptions::validate(const std::string& op) const {
  using detail::py_float;
  if (!(lr_ >= 0.0)) throw ValueError(op, "Invalid learning rate: " + py_float(lr_));
  if (!(eps_ >= 0.0)) throw ValueError(op, "Invalid epsilon value: " + py_float(eps_));
  if (!(betas_[0] >= 0.0 && betas_[0] < 1.0))
    throw ValueError(op, "Invalid beta parameter at index 0: " + py_float(betas_[0]));
  if (!(betas_[1] >= 0.0 && betas_[1] < 1.0))
    throw ValueError(op, "Invalid beta parameter at index 1: " + py_float(betas_[1]));
  if (!(weight_decay_ >= 0.0)) throw ValueError(op, "Invalid weight_decay value: " + py_float(weight_decay_));
}

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
    T mi = m[i] * s.beta1;
    mi = std::fma(s.one_minus_beta1, gi, mi);
    T vi = v[i] * s.beta2;
    vi = std::fma(s.one_minus_beta2 * gi, gi, vi);
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

DOPT_KERNEL void radam_f32(float* p, const float* g, float* m, float* v, i64 n, const RAdamScalars<float>& s,
                           bool wd, bool rect) {
  radam_select(p, g, m, v, n, s, wd, rect);
}
DOPT_KERNEL void radam_f64(double* p, const double* g, double* m, double* v, i64 n,
                           const RAdamScalars<double>& s, bool wd, bool rect) {
  radam_select(p, g, m, v, n, s, wd, rect);
}
inline void radam_kernel(float* p, const float* g, float* m, float* v, i64 n, const RAdamScalars<float>& s,
                         bool wd, bool rect) {
  radam_f32(p, g, m, v, n, s, wd, rect);
}
inline void radam_kernel(double* p, const double* g, double* m, double* v, i64 n, const RAdamScalars<double>& s,
                         bool wd, bool rect) {
  radam_f64(p, g, m, v, n, s, wd, rect);
}

}  // namespace
}  // namespace kernels

void RAdam::init_param_state(const RAdamOptions& /*o*/, const Tensor& p, ParamState& st) {
  st["step"] = Tensor::scalar(0.0, DType::float32);
  st["exp_avg"] = Tensor::zeros(p.shape(), p.dtype(), p.device());
  st["exp_avg_sq"] = Tensor::zeros(p.shape(), p.dtype(), p.device());
}

void RAdam::update_param(const RAdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "RAdam.step";
  if (!p.device().is_cpu())
    throw NotSupportedError(op, "RAdam has no kernel for parameters on " + p.device().str() +
                                    " (it runs on the CPU only)");
  Tensor& step_t = detail::state_at(st, "step", op);
  Tensor& m = detail::matching_state_at(st, "exp_avg", p, op);
  Tensor& v = detail::matching_state_at(st, "exp_avg_sq", p, op);
  kernels::dispatch_float(p, op, [](auto) {});  // dtype errors before any change
  const double s = detail::increment_step(step_t);
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

RAdam::RAdam(std::vector<Tensor> params, RAdamOptions defaults)
    : RAdam(single_group(std::move(params), "RAdam"), std::move(defaults)) {}

RAdam::RAdam(std::vector<OptimizerParamGroup> groups, RAdamOptions defaults)
    : Optimizer("RAdam", {}, std::make_unique<RAdamOptions>(std::move(defaults))) {
  init_groups(std::move(groups));
}

void RAdam::init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const {
  init_param_state(static_cast<const RAdamOptions&>(o), p, st);
}

void RAdam::update(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const {
  update_param(static_cast<const RAdamOptions&>(o), p, g, st);
}

}  // namespace dopt::optim
