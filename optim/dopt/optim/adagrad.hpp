#pragma once
// torch.optim.Adagrad (1.13), float32/float64 results bit-identical to torch's
// single-tensor dense path.
//
// State: `step` (float32 0-d tensor) and `sum` (full of the optimizer's
// default initial_accumulator_value, as torch: a group's own value is kept in
// the group but not used), created eagerly for every parameter when its group
// is added, as torch's constructor does. dopt does this for groups added
// later with add_param_group too (torch 1.13 leaves those without state and
// fails with KeyError at their first step), and creates the same fresh state
// lazily for a parameter whose state a loaded state dict did not contain.
// Sparse gradients do not exist in dopt.
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class AdagradOptions : public OptionsCRTP<AdagradOptions> {
  DOPT_OPTIONS_WITH_LR(AdagradOptions, 1e-2);
  DOPT_ARG(AdagradOptions, double, lr_decay, 0.0, checks::NonNegative{"lr_decay value"});
  DOPT_ARG_WEIGHT_DECAY(AdagradOptions, 0.0);
  DOPT_ARG(AdagradOptions, double, initial_accumulator_value, 0.0, checks::NonNegative{"initial_accumulator_value value"});
  DOPT_ARG_EPS(AdagradOptions, 1e-10);
  DOPT_ARG_MAXIMIZE(AdagradOptions);
};

/// Unlike the others, Adagrad makes the state of every parameter as its group
/// is added (`step` = 0, `sum` = full(initial_accumulator_value)), as torch.
class Adagrad : public BasicOptimizer<Adagrad, AdagradOptions> {
  DOPT_OPTIMIZER(Adagrad, AdagradOptions);
  /// The state of a parameter is made when it is added (also by FunctionalAdagrad).
  static constexpr bool kEagerState = true;
  explicit Adagrad(std::vector<OptimizerParamGroup> groups, AdagradOptions defaults = AdagradOptions());
  /// One group of `params`; an empty list throws dopt::ValueError (as torch).
  explicit Adagrad(std::vector<Tensor> params, AdagradOptions defaults = AdagradOptions());

 protected:
  void init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const override;
  /// Creates the state of every parameter of the group (torch's constructor).
  void on_group_added(OptimizerParamGroup& group) override;
};

}  // namespace dopt::optim
