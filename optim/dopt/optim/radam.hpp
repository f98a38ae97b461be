#pragma once
// torch.optim.RAdam (1.13): Adam with the variance rectification of Liu et
// al.; float32/float64 results bit-identical to torch's single-tensor path
// (docs/optimizers.md has the formulas).
//
// State (lazy, at a parameter's first step with a gradient): `step` (float32
// 0-d tensor, float32 arithmetic like torch), `exp_avg`, `exp_avg_sq`.
// weight_decay is the L2 form (added to the gradient); torch 1.13's RAdam has
// no `maximize`. While the rectification term is undefined (rho_t <= 5: the
// first five steps with the default beta2) the step is plain momentum SGD on
// the bias-corrected first moment.
//
// CPU only: parameters on another device are refused with NotSupportedError
// naming RAdam (no fused CUDA kernel yet).
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class RAdamOptions : public OptionsCRTP<RAdamOptions> {
  DOPT_OPTIONS_WITH_LR(RAdamOptions, 1e-3);
  DOPT_ADAM_ARGS(RAdamOptions, 0.0);
};

/// update_param refuses a parameter off the CPU with dopt::NotSupportedError.
class RAdam : public BasicOptimizer<RAdam, RAdamOptions> {
  DOPT_OPTIMIZER(RAdam, RAdamOptions);
  static constexpr bool kDeviceKernels = false;
};

}  // namespace dopt::optim
