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
  DOPT_OPTIONS(AdamaxOptions);
  DOPT_ARG(AdamaxOptions, double, lr, 2e-3, checks::NonNegative{"learning rate"});
  DOPT_ARG(AdamaxOptions, Pair, betas, (Pair{0.9, 0.999}), checks::Betas{});
  DOPT_ARG(AdamaxOptions, double, eps, 1e-8, checks::NonNegative{"epsilon value"});
  DOPT_ARG(AdamaxOptions, double, weight_decay, 0.0, checks::NonNegative{"weight_decay value"});
  DOPT_ARG(AdamaxOptions, bool, maximize, false);
};

class Adamax : public BasicOptimizer<Adamax, AdamaxOptions> {
  DOPT_OPTIMIZER(Adamax, AdamaxOptions);
};

}  // namespace dopt::optim
