#pragma once
// torch.optim.NAdam (1.13): Adam with Nesterov momentum and a momentum
// schedule; float32/float64 results bit-identical to torch's single-tensor
// path (docs/optimizers.md has the formulas).
//
// State (lazy, at a parameter's first step with a gradient): `step` (float32
// 0-d tensor, float32 arithmetic like torch), `mu_product` (float32 0-d
// tensor: the running product of the momentum coefficients, computed in
// float32 whatever the parameter dtype, as torch keeps it), `exp_avg` and
// `exp_avg_sq`. weight_decay is the L2 form (added to the gradient); torch
// 1.13's NAdam has no `maximize`.
//
// CPU only: parameters on another device are refused with NotSupportedError
// naming NAdam (no fused CUDA kernel yet).
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class NAdamOptions : public OptionsCRTP<NAdamOptions> {
  DOPT_OPTIONS_WITH_LR(NAdamOptions, 2e-3);
  DOPT_ADAM_ARGS(NAdamOptions, 0.0);
  DOPT_ARG(NAdamOptions, double, momentum_decay, 4e-3, checks::NonNegative{"momentum_decay value"});
};

/// update_param refuses a parameter off the CPU with dopt::NotSupportedError.
class NAdam : public BasicOptimizer<NAdam, NAdamOptions> {
  DOPT_OPTIMIZER(NAdam, NAdamOptions);
  static constexpr bool kDeviceKernels = false;
};

}  // namespace dopt::optim
