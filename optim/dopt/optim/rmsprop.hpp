#pragma once
// torch.optim.RMSprop (1.13), float32/float64 results bit-identical to torch's
// single-tensor path.
//
// State (lazy, at a parameter's first step with a gradient): `step` (int64 0-d
// tensor, torch's Python int; incremented but unused by the math),
// `square_avg`, `momentum_buffer` only if momentum > 0 and `grad_avg` only if
// centered, both decided when the state is created. Turning momentum or
// centered on after that makes step() throw dopt::StateError (torch: KeyError).
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class RMSpropOptions : public OptionsCRTP<RMSpropOptions> {
 public:
  explicit RMSpropOptions(double lr = 1e-2) : lr_(lr) {}
  Hyperparams to_hyperparams() const override;
  void set_hyperparams(const Hyperparams& h) override;
  void validate(const std::string& op) const override;

  DOPT_ARG(RMSpropOptions, double, lr, 1e-2);
  DOPT_ARG(RMSpropOptions, double, alpha, 0.99);
  DOPT_ARG(RMSpropOptions, double, eps, 1e-8);
  DOPT_ARG(RMSpropOptions, double, weight_decay, 0.0);
  DOPT_ARG(RMSpropOptions, double, momentum, 0.0);
  DOPT_ARG(RMSpropOptions, bool, centered, false);
  DOPT_ARG(RMSpropOptions, bool, maximize, false);
};

class RMSprop : public Optimizer {
 public:
  using Options = RMSpropOptions;
  explicit RMSprop(std::vector<OptimizerParamGroup> groups, RMSpropOptions defaults = RMSpropOptions());
  /// One group of `params`; an empty list throws dopt::ValueError (as torch).
  explicit RMSprop(std::vector<Tensor> params, RMSpropOptions defaults = RMSpropOptions());

  /// One parameter's lazy state and update (shared with FunctionalRMSprop).
  static void init_param_state(const RMSpropOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const RMSpropOptions& o, const Tensor& p, const Tensor& g, ParamState& st);

 protected:
  void init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const override;
  void update(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const override;
};

}  // namespace dopt::optim
