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
  /// lr is required, as in torch 1.13 (there is no default constructor).
  DOPT_OPTIONS_LR_REQUIRED(SGDOptions);
  /// The fields' rules, then: nesterov needs a momentum and zero dampening.
  void validate(const std::string& op) const override;

  DOPT_ARG_LR(SGDOptions, 0.0);
  DOPT_ARG(SGDOptions, double, momentum, 0.0, checks::NonNegative{"momentum value"});
  DOPT_ARG(SGDOptions, double, dampening, 0.0);
  DOPT_ARG_WEIGHT_DECAY(SGDOptions, 0.0);
  DOPT_ARG(SGDOptions, bool, nesterov, false);
  DOPT_ARG_MAXIMIZE(SGDOptions);
};

/// SGD has no state up front: update_param creates `momentum_buffer` when
/// momentum != 0 and it is absent.
class SGD : public BasicOptimizer<SGD, SGDOptions> {
  DOPT_OPTIMIZER(SGD, SGDOptions);
};

}  // namespace dopt::optim
