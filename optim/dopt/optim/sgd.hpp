#pragma once
// torch.optim.SGD (1.13), float32/float64 results bit-identical to torch's
// single-tensor path.
//
// State: `momentum_buffer` only when the group's momentum is non-zero; it is
// created at the parameter's first step with momentum as a copy of the
// (maximize-flipped, weight-decayed) gradient. torch stores
// `momentum_buffer: None` for momentum 0; dopt stores nothing instead.
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class SGDOptions : public OptionsCRTP<SGDOptions> {
 public:
  /// lr is required, as in torch 1.13 (there is no default constructor).
  explicit SGDOptions(double lr) : lr_(lr) {}
  static constexpr const char* kName = "SGDOptions";
  static std::vector<HyperField<SGDOptions>> fields();
  void validate(const std::string& op) const override;

  DOPT_ARG(SGDOptions, double, lr, 0.0);
  DOPT_ARG(SGDOptions, double, momentum, 0.0);
  DOPT_ARG(SGDOptions, double, dampening, 0.0);
  DOPT_ARG(SGDOptions, double, weight_decay, 0.0);
  DOPT_ARG(SGDOptions, bool, nesterov, false);
  DOPT_ARG(SGDOptions, bool, maximize, false);
};

class SGD : public BasicOptimizer<SGD, SGDOptions> {
 public:
  static constexpr const char* kName = "SGD";
  using BasicOptimizer::BasicOptimizer;
  /// One parameter's lazy state (SGD has none up front) and update (shared
  /// with the functional form). update_param creates `momentum_buffer` when
  /// momentum != 0 and it is absent.
  static void init_param_state(const SGDOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const SGDOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
};

}  // namespace dopt::optim
