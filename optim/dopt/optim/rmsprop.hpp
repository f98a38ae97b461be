#pragma once
// torch.optim.RMSprop (1.13), float32/float64 results bit-identical to torch's
// single-tensor path.
//
// State (lazy, at a parameter's first step with a gradient): `step` (int64 0-d
// tensor, torch's Python int; incremented but unused by the math),
// `square_avg`, `momentum_buffer` only if momentum > 0 and `grad_avg` only if
// centered, both decided when the state is created. Turning momentum or
// centered on after that makes step() throw dopt::StateError (torch: KeyError).
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class RMSpropOptions : public OptionsCRTP<RMSpropOptions> {
 public:
  explicit RMSpropOptions(double lr = 1e-2) : lr_(lr) {}
  static constexpr const char* kName = "RMSpropOptions";
  static std::vector<HyperField<RMSpropOptions>> fields();
  void validate(const std::string& op) const override;

  DOPT_ARG(RMSpropOptions, double, lr, 1e-2);
  DOPT_ARG(RMSpropOptions, double, alpha, 0.99);
  DOPT_ARG(RMSpropOptions, double, eps, 1e-8);
  DOPT_ARG(RMSpropOptions, double, weight_decay, 0.0);
  DOPT_ARG(RMSpropOptions, double, momentum, 0.0);
  DOPT_ARG(RMSpropOptions, bool, centered, false);
  DOPT_ARG(RMSpropOptions, bool, maximize, false);
};

class RMSprop : public BasicOptimizer<RMSprop, RMSpropOptions> {
 public:
  static constexpr const char* kName = "RMSprop";
  using BasicOptimizer::BasicOptimizer;
  /// One parameter's lazy state and update (shared with FunctionalRMSprop).
  static void init_param_state(const RMSpropOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const RMSpropOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
};

}  // namespace dopt::optim
