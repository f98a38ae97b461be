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
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class RAdamOptions : public OptionsCRTP<RAdamOptions> {
 public:
  explicit RAdamOptions(double lr = 1e-3) : lr_(lr) {}
  Hyperparams to_hyperparams() const override;
  void set_hyperparams(const Hyperparams& h) override;
  /// torch's checks: lr >= 0, eps >= 0, 0 <= betas[i] < 1, weight_decay >= 0.
  void validate(const std::string& op) const override;

  DOPT_ARG(RAdamOptions, double, lr, 1e-3);
  DOPT_ARG(RAdamOptions, Pair, betas, (Pair{0.9, 0.999}));
  DOPT_ARG(RAdamOptions, double, eps, 1e-8);
  DOPT_ARG(RAdamOptions, double, weight_decay, 0.0);
};

class RAdam : public Optimizer {
 public:
  using Options = RAdamOptions;
  explicit RAdam(std::vector<OptimizerParamGroup> groups, RAdamOptions defaults = RAdamOptions());
  /// One group of `params`; an empty list throws dopt::ValueError (as torch).
  explicit RAdam(std::vector<Tensor> params, RAdamOptions defaults = RAdamOptions());

  /// One parameter's lazy state and update (shared with FunctionalRAdam);
  /// errors as NAdam's.
  static void init_param_state(const RAdamOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const RAdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
  /// RAdam has no device kernels (see the header).
  static constexpr bool kDeviceKernels = false;

 protected:
  void init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const override;
  void update(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const override;
  bool has_device_kernels() const noexcept override { return false; }
};

}  // namespace dopt::optim
