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
  DOPT_OPTIONS_WITH_LR(RMSpropOptions, 1e-2);
  DOPT_ARG(RMSpropOptions, double, alpha, 0.99, checks::NonNegative{"alpha value"});
  DOPT_ARG_EPS(RMSpropOptions, 1e-8);
  DOPT_ARG_WEIGHT_DECAY(RMSpropOptions, 0.0);
  DOPT_ARG(RMSpropOptions, double, momentum, 0.0, checks::NonNegative{"momentum value"});
  DOPT_ARG(RMSpropOptions, bool, centered, false);
  DOPT_ARG_MAXIMIZE(RMSpropOptions);
};

class RMSprop : public BasicOptimizer<RMSprop, RMSpropOptions> {
  DOPT_OPTIMIZER(RMSprop, RMSpropOptions);
};

}  // namespace dopt::optim
