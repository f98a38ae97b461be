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
  DOPT_OPTIONS_WITH_LR(AdadeltaOptions, 1.0);
  DOPT_ARG(AdadeltaOptions, double, rho, 0.9, checks::UnitInterval{"rho value"});
  DOPT_ARG_EPS(AdadeltaOptions, 1e-6);
  DOPT_ARG_WEIGHT_DECAY(AdadeltaOptions, 0.0);
  DOPT_ARG_MAXIMIZE(AdadeltaOptions);
};

class Adadelta : public BasicOptimizer<Adadelta, AdadeltaOptions> {
  DOPT_OPTIMIZER(Adadelta, AdadeltaOptions);
};

}  // namespace dopt::optim
