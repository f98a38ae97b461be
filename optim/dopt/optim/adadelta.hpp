#pragma once
// torch.optim.Adadelta (1.13), float32/float64 results bit-identical to
// torch's single-tensor path.
//
// State (lazy, at a parameter's first step with a gradient): `step` (int64 0-d
// tensor, torch's Python int; incremented but unused by the math),
// `square_avg` and `acc_delta`.
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class AdadeltaOptions : public OptionsCRTP<AdadeltaOptions> {
 public:
  explicit AdadeltaOptions(double lr = 1.0) : lr_(lr) {}
  static constexpr const char* kName = "AdadeltaOptions";
  static std::vector<HyperField<AdadeltaOptions>> fields();
  /// torch's checks: lr >= 0, 0 <= rho <= 1, eps >= 0, weight_decay >= 0.
  void validate(const std::string& op) const override;

  DOPT_ARG(AdadeltaOptions, double, lr, 1.0);
  DOPT_ARG(AdadeltaOptions, double, rho, 0.9);
  DOPT_ARG(AdadeltaOptions, double, eps, 1e-6);
  DOPT_ARG(AdadeltaOptions, double, weight_decay, 0.0);
  DOPT_ARG(AdadeltaOptions, bool, maximize, false);
};

class Adadelta : public BasicOptimizer<Adadelta, AdadeltaOptions> {
 public:
  static constexpr const char* kName = "Adadelta";
  using BasicOptimizer::BasicOptimizer;
  /// One parameter's lazy state and update (shared with FunctionalAdadelta).
  /// update_param expects a grad that matches p and the state made by
  /// init_param_state (dopt::StateError otherwise).
  static void init_param_state(const AdadeltaOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const AdadeltaOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
};

}  // namespace dopt::optim
