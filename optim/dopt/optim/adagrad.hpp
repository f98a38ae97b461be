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
 public:
  explicit AdagradOptions(double lr = 1e-2) : lr_(lr) {}
  static constexpr const char* kName = "AdagradOptions";
  static std::vector<HyperField<AdagradOptions>> fields();
  void validate(const std::string& op) const override;

  DOPT_ARG(AdagradOptions, double, lr, 1e-2);
  DOPT_ARG(AdagradOptions, double, lr_decay, 0.0);
  DOPT_ARG(AdagradOptions, double, weight_decay, 0.0);
  DOPT_ARG(AdagradOptions, double, initial_accumulator_value, 0.0);
  DOPT_ARG(AdagradOptions, double, eps, 1e-10);
  DOPT_ARG(AdagradOptions, bool, maximize, false);
};

class Adagrad : public BasicOptimizer<Adagrad, AdagradOptions> {
 public:
  static constexpr const char* kName = "Adagrad";
  explicit Adagrad(std::vector<OptimizerParamGroup> groups, AdagradOptions defaults = AdagradOptions());
  /// One group of `params`; an empty list throws dopt::ValueError (as torch).
  explicit Adagrad(std::vector<Tensor> params, AdagradOptions defaults = AdagradOptions());

  /// One parameter's state (`step` = 0, `sum` = full(initial_accumulator_value))
  /// and update (shared with FunctionalAdagrad).
  static void init_param_state(const AdagradOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const AdagradOptions& o, const Tensor& p, const Tensor& g, ParamState& st);

 protected:
  void init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const override;
  /// Creates the state of every parameter of the group (torch's constructor).
  void on_group_added(OptimizerParamGroup& group) override;
};

}  // namespace dopt::optim
