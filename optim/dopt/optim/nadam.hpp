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
 public:
  explicit NAdamOptions(double lr = 2e-3) : lr_(lr) {}
  static constexpr const char* kName = "NAdamOptions";
  static std::vector<HyperField<NAdamOptions>> fields();
  /// torch's checks: lr >= 0, eps >= 0, 0 <= betas[i] < 1, weight_decay >= 0,
  /// momentum_decay >= 0.
  void validate(const std::string& op) const override;

  DOPT_ARG(NAdamOptions, double, lr, 2e-3);
  DOPT_ARG(NAdamOptions, Pair, betas, (Pair{0.9, 0.999}));
  DOPT_ARG(NAdamOptions, double, eps, 1e-8);
  DOPT_ARG(NAdamOptions, double, weight_decay, 0.0);
  DOPT_ARG(NAdamOptions, double, momentum_decay, 4e-3);
};

class NAdam : public BasicOptimizer<NAdam, NAdamOptions> {
 public:
  static constexpr const char* kName = "NAdam";
  using BasicOptimizer::BasicOptimizer;
  /// One parameter's lazy state and update (shared with FunctionalNAdam).
  /// update_param expects a grad that matches p; a state lacking an entry,
  /// or whose tensors do not match p, is a dopt::StateError; a parameter off
  /// the CPU is a dopt::NotSupportedError.
  static void init_param_state(const NAdamOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const NAdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
  /// NAdam has no device kernels (see the header).
  static constexpr bool kDeviceKernels = false;
};

}  // namespace dopt::optim
