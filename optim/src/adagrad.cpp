#include "dopt/optim/adagrad.hpp"

#include "param_step.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct AdagradScalars {
  T gsign, wd, eps, neg_clr;
  bool has_wd;
  /// clr: the decayed learning rate of this step.
  AdagradScalars(const AdagradOptions& o, double clr)
      : gsign(o.maximize() ? T(-1) : T(1)), wd(sc<T>(o.weight_decay())), eps(sc<T>(o.eps())), neg_clr(sc<T>(-clr)),
        has_wd(o.weight_decay() != 0.0) {}
};

// No control flow in the loop (vectorises); maximize is an exact * -1.
template <class T, bool Wd>
inline __attribute__((always_inline)) void adagrad_body(T* __restrict p, const T* __restrict g, T* __restrict sum,
                                                        i64 n, const AdagradScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, sum) {
    const T pi = p[i];
    const T gi = kernels::decayed_grad<Wd>(g[i], pi, s);
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

DOPT_KERNEL_ENTRY(adagrad_kernel, adagrad_select, (p, g, sum, n, s), T* p, const T* g, T* sum, i64 n,
                  const AdagradScalars<T>& s)

}  // namespace
}  // namespace kernels

// A float32 step counter; `sum` starts full of initial_accumulator_value.
constexpr detail::StateLayout<1> kAdagradState{DType::float32, {"sum"}};

void Adagrad::update_param(const AdagradOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const auto step = kAdagradState.begin("Adagrad.step", p, g, st);
  const double clr = o.lr() / (1.0 + (step.step - 1.0) * o.lr_decay());
  step.run<kernels::AdagradScalars>(kernels::adagrad_kernel, o, clr);
}

void Adagrad::init_param_state(const AdagradOptions& o, const Tensor& p, ParamState& st) {
  kAdagradState.init(p, st, {false});
  st["sum"] = Tensor::full(p.shape(), o.initial_accumulator_value(), p.dtype(), p.device());
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
