#include "dopt/optim/adagrad.hpp"

#include "kernel_support.hpp"
#include "optim_extra.hpp"
#include "optim_util.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct AdagradScalars {
  T gsign, wd, eps, neg_clr;
  bool has_wd;
};

// No control flow in the loop (vectorises); maximize is an exact * -1.
template <class T, bool Wd>
inline __attribute__((always_inline)) void adagrad_body(T* __restrict p, const T* __restrict g, T* __restrict sum,
                                                        i64 n, const AdagradScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, sum) {
    const T pi = p[i];
    T gi = g[i] * s.gsign;
    if constexpr (Wd) gi = std::fma(s.wd, pi, gi);
    const T si = std::fma(gi, gi, sum[i]);
    const T std_i = std::sqrt(si) + s.eps;
    p[i] = pi + (s.neg_clr * gi) / std_i;
    sum[i] = si;
  }
}

template <class T>
inline __attribute__((always_inline)) void adagrad_select(T* p, const T* g, T* sum, i64 n,
                                                          const AdagradScalars<T>& s) {
  if (s.has_wd) adagrad_body<T, true>(p, g, sum, n, s);
  else adagrad_body<T, false>(p, g, sum, n, s);
}

#define DOPT_ADAGRAD_PARAMS(T) T* p, const T* g, T* sum, i64 n, const AdagradScalars<T>& s
DOPT_KERNEL_ENTRY(adagrad_kernel, adagrad_select, DOPT_ADAGRAD_PARAMS, (p, g, sum, n, s))
#undef DOPT_ADAGRAD_PARAMS

}  // namespace
}  // namespace kernels

void Adagrad::init_param_state(const AdagradOptions& o, const Tensor& p, ParamState& st) {
  st["step"] = Tensor::scalar(0.0, DType::float32);
  st["sum"] = Tensor::full(p.shape(), o.initial_accumulator_value(), p.dtype(), p.device());
}

void Adagrad::update_param(const AdagradOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "Adagrad.step";
  Tensor& step_t = detail::state_at(st, "step", op);
  Tensor& sum = detail::state_at(st, "sum", op);
  if (sum.shape() != p.shape() || sum.dtype() != p.dtype())
    throw StateError(op, "state 'sum' " + sum.str() + " does not match parameter " + p.str());
  const double s = detail::increment_step(step_t);
  const double clr = o.lr() / (1.0 + (s - 1.0) * o.lr_decay());
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    using kernels::sc;
    kernels::AdagradScalars<T> k{o.maximize() ? T(-1) : T(1), sc<T>(o.weight_decay()), sc<T>(o.eps()), sc<T>(-clr),
                                 o.weight_decay() != 0.0};
    kernels::adagrad_kernel(p.data<T>(), g.data<T>(), sum.template data<T>(), p.numel(), k);
  });
}

Adagrad::Adagrad(std::vector<Tensor> params, AdagradOptions defaults)
    : Adagrad(single_group(std::move(params), "Adagrad"), std::move(defaults)) {}

Adagrad::Adagrad(std::vector<OptimizerParamGroup> groups, AdagradOptions defaults)
    : BasicOptimizer(DeferGroups{}, std::move(defaults)) {
  init_groups(std::move(groups));
}

namespace {
// torch 1.13 fills `sum` from the constructor's initial_accumulator_value for
// every group, ignoring a group's own value; so does dopt.
AdagradOptions with_default_iav(const OptimizerOptions& group, const OptimizerOptions& defaults) {
  AdagradOptions o = static_cast<const AdagradOptions&>(group);
  o.initial_accumulator_value(static_cast<const AdagradOptions&>(defaults).initial_accumulator_value());
  return o;
}
}  // namespace

void Adagrad::on_group_added(OptimizerParamGroup& group) {
  const AdagradOptions o = with_default_iav(*group.options, defaults());
  for (const Tensor& p : group.params) {
    ParamState& st = state()[p.key()];
    if (st.empty()) init_param_state(o, p, st);
  }
}

void Adagrad::init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const {
  init_param_state(with_default_iav(o, defaults()), p, st);
}

}  // namespace dopt::optim
