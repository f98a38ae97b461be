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
  DOPT_OPTIONS_WITH_LR(AdamWOptions, 1e-3);
  DOPT_ADAM_ARGS(AdamWOptions, 1e-2);
  DOPT_ARG(AdamWOptions, bool, amsgrad, false);
  DOPT_ARG_MAXIMIZE(AdamWOptions);

 public:
  /// The same hyperparameters as AdamOptions (for Adam's kernel).
  AdamOptions as_adam_options() const;
};

class AdamW : public BasicOptimizer<AdamW, AdamWOptions> {
  DOPT_OPTIMIZER(AdamW, AdamWOptions);
};

}  // namespace dopt::optim
