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
 public:
  explicit RAdamOptions(double lr = 1e-3) : lr_(lr) {}
  static constexpr const char* kName = "RAdamOptions";
  static std::vector<HyperField<RAdamOptions>> fields();
  /// torch's checks: lr >= 0, eps >= 0, 0 <= betas[i] < 1, weight_decay >= 0.
  void validate(const std::string& op) const override;

  DOPT_ARG(RAdamOptions, double, lr, 1e-3);
  DOPT_ARG(RAdamOptions, Pair, betas, (Pair{0.9, 0.999}));
  DOPT_ARG(RAdamOptions, double, eps, 1e-8);
  DOPT_ARG(RAdamOptions, double, weight_decay, 0.0);
};

class RAdam : public BasicOptimizer<RAdam, RAdamOptions> {
 public:
  static constexpr const char* kName = "RAdam";
  using BasicOptimizer::BasicOptimizer;
  /// One parameter's lazy state and update (shared with FunctionalRAdam);
  /// errors as NAdam's.
  static void init_param_state(const RAdamOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const RAdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
  /// RAdam has no device kernels (see the header).
  static constexpr bool kDeviceKernels = false;
};

}  // namespace dopt::optim
