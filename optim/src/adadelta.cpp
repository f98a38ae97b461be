#include "dopt/optim/adadelta.hpp"

#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {

Hyperparams AdadeltaOptions::to_hyperparams() const {
  return {{"lr", lr_}, {"rho", rho_}, {"eps", eps_}, {"weight_decay", weight_decay_}, {"maximize", maximize_}};
}

void AdadeltaOptions::set_hyperparams(const Hyperparams& h) {
  const char* op = "AdadeltaOptions";
  detail::check_known_keys(h, {"lr", "rho", "eps", "weight_decay", "maximize"}, op);
  if (h.count("lr")) lr_ = hyper_number(h, "lr", op);
  if (h.count("rho")) rho_ = hyper_number(h, "rho", op);
  if (h.count("eps")) eps_ = hyper_number(h, "eps", op);
  if (h.count("weight_decay")) weight_decay_ = hyper_number(h, "weight_decay", op);
  if (h.count("maximize")) maximize_ = hyper_flag(h, "maximize", op);
}

void AdadeltaOptions::validate(const std::string& op) const {
  using detail::py_float;
  if (!(lr_ >= 0.0)) throw ValueError(op, "Invalid learning rate: " + py_float(lr_));
  if (!(rho_ >= 0.0 && rho_ <= 1.0)) throw ValueError(op, "Invalid rho value: " + py_float(rho_));
  if (!(eps_ >= 0.0)) throw ValueError(op, "Invalid epsilon value: " + py_float(eps_));
  if (!(weight_decay_ >= 0.0)) throw ValueError(op, "Invalid weight_decay value: " + py_float(weight_decay_));
}

namespace kernels {
namespace {

template <class T>
struct AdadeltaScalars {
  T gsign, wd, rho, one_minus_rho, eps, neg_lr;
};

// No control flow in the loop (vectorises); maximize is an exact * -1.
template <class T, bool Wd>
DOPT_INLINE void adadelta_body(T* __restrict p, const T* __restrict g, T* __restrict sq, T* __restrict acc, i64 n,
                               const AdadeltaScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, sq, acc) {
    const T pi = p[i];
    T gi = g[i] * s.gsign;
    if constexpr (Wd) gi = std::fma(s.wd, pi, gi);
    T sqi = sq[i] * s.rho;
    sqi = std::fma(s.one_minus_rho * gi, gi, sqi);
    const T stdv = std::sqrt(sqi + s.eps);
    T ai = acc[i];
    const T delta = (std::sqrt(ai + s.eps) / stdv) * gi;
    ai = ai * s.rho;
    ai = std::fma(s.one_minus_rho * delta, delta, ai);
    p[i] = std::fma(s.neg_lr, delta, pi);
    sq[i] = sqi;
    acc[i] = ai;
  }
}

template <class T>
DOPT_INLINE void adadelta_select(T* p, const T* g, T* sq, T* acc, i64 n, const AdadeltaScalars<T>& s, bool wd) {
  if (wd) adadelta_body<T, true>(p, g, sq, acc, n, s);
  else adadelta_body<T, false>(p, g, sq, acc, n, s);
}

DOPT_KERNEL void adadelta_f32(float* p, const float* g, float* sq, float* acc, i64 n,
                              const AdadeltaScalars<float>& s, bool wd) {
  adadelta_select(p, g, sq, acc, n, s, wd);
}
DOPT_KERNEL void adadelta_f64(double* p, const double* g, double* sq, double* acc, i64 n,
                              const AdadeltaScalars<double>& s, bool wd) {
  adadelta_select(p, g, sq, acc, n, s, wd);
}
inline void adadelta_kernel(float* p, const float* g, float* sq, float* acc, i64 n,
                            const AdadeltaScalars<float>& s, bool wd) {
  adadelta_f32(p, g, sq, acc, n, s, wd);
}
inline void adadelta_kernel(double* p, const double* g, double* sq, double* acc, i64 n,
                            const AdadeltaScalars<double>& s, bool wd) {
  adadelta_f64(p, g, sq, acc, n, s, wd);
}

}  // namespace
}  // namespace kernels

void Adadelta::init_param_state(const AdadeltaOptions& /*o*/, const Tensor& p, ParamState& st) {
  st["step"] = Tensor::scalar(0.0, DType::int64);
  st["square_avg"] = Tensor::zeros(p.shape(), p.dtype(), p.device());
  st["acc_delta"] = Tensor::zeros(p.shape(), p.dtype(), p.device());
}

void Adadelta::update_param(const AdadeltaOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "Adadelta.step";
  Tensor& step_t = detail::state_at(st, "step", op);
  Tensor& sq = detail::matching_state_at(st, "square_avg", p, op);
  Tensor& acc = detail::matching_state_at(st, "acc_delta", p, op);
  detail::increment_step(step_t);
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    using kernels::sc;
    kernels::AdadeltaScalars<T> k{o.maximize() ? T(-1) : T(1), sc<T>(o.weight_decay()), sc<T>(o.rho()),
                                  sc<T>(1.0 - o.rho()),         sc<T>(o.eps()),           sc<T>(-o.lr())};
    kernels::adadelta_kernel(p.data<T>(), g.data<T>(), sq.template data<T>(), acc.template data<T>(), p.numel(), k,
                             o.weight_decay() != 0.0);
  });
}

Adadelta::Adadelta(std::vector<Tensor> params, AdadeltaOptions defaults)
    : Adadelta(single_group(std::move(params), "Adadelta"), std::move(defaults)) {}

Adadelta::Adadelta(std::vector<OptimizerParamGroup> groups, AdadeltaOptions defaults)
    : Optimizer("Adadelta", {}, std::make_unique<AdadeltaOptions>(std::move(defaults))) {
  init_groups(std::move(groups));
}

void Adadelta::init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const {
  init_param_state(static_cast<const AdadeltaOptions&>(o), p, st);
}

void Adadelta::update(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const {
  update_param(static_cast<const AdadeltaOptions&>(o), p, g, st);
}

}  // namespace dopt::optim
