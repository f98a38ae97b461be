#pragma once
// torch.optim.Adamax (1.13), float32/float64 results bit-identical to torch's
// single-tensor path.
//
// State (lazy, at a parameter's first step with a gradient): `step` (float32
// 0-d tensor, float32 arithmetic like torch: saturates at 2^24), `exp_avg`
// (first moment) and `exp_inf` (exponentially weighted infinity norm). The
// max in exp_inf = max(exp_inf * beta2, |g| + eps) propagates NaN, like
// torch.amax.
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class AdamaxOptions : public OptionsCRTP<AdamaxOptions> {
  DOPT_OPTIONS_WITH_LR(AdamaxOptions, 2e-3);
  DOPT_ADAM_ARGS(AdamaxOptions, 0.0);
  DOPT_ARG_MAXIMIZE(AdamaxOptions);
};

class Adamax : public BasicOptimizer<Adamax, AdamaxOptions> {
  DOPT_OPTIMIZER(Adamax, AdamaxOptions);
};

}  // namespace dopt::optim
