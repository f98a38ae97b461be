#pragma once
// torch.optim.AdamW (1.13), float32/float64 results bit-identical to torch's
// single-tensor path: Adam with the decoupled weight decay
// p = p * (1 - lr * weight_decay) applied unconditionally before the moments,
// and no L2 term on the gradient. State as Adam: `step` (float32 0-d),
// `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq` (amsgrad).
#include "dopt/optim/adam.hpp"
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class AdamWOptions : public OptionsCRTP<AdamWOptions> {
  DOPT_OPTIONS(AdamWOptions);
  /// The same hyperparameters as AdamOptions (for Adam's kernel).
  AdamOptions as_adam_options() const;

  DOPT_ARG(AdamWOptions, double, lr, 1e-3, checks::NonNegative{"learning rate"});
  DOPT_ARG(AdamWOptions, Pair, betas, (Pair{0.9, 0.999}), checks::Betas{});
  DOPT_ARG(AdamWOptions, double, eps, 1e-8, checks::NonNegative{"epsilon value"});
  DOPT_ARG(AdamWOptions, double, weight_decay, 1e-2, checks::NonNegative{"weight_decay value"});
  DOPT_ARG(AdamWOptions, bool, amsgrad, false);
  DOPT_ARG(AdamWOptions, bool, maximize, false);
};

class AdamW : public BasicOptimizer<AdamW, AdamWOptions> {
  DOPT_OPTIMIZER(AdamW, AdamWOptions);
};

}  // namespace dopt::optim
