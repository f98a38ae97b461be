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
 public:
  explicit AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  static constexpr const char* kName = "AdamWOptions";
  static std::vector<HyperField<AdamWOptions>> fields();
  void validate(const std::string& op) const override;
  /// The same hyperparameters as AdamOptions (for Adam's kernel).
  AdamOptions as_adam_options() const;

  DOPT_ARG(AdamWOptions, double, lr, 1e-3);
  DOPT_ARG(AdamWOptions, Pair, betas, (Pair{0.9, 0.999}));
  DOPT_ARG(AdamWOptions, double, eps, 1e-8);
  DOPT_ARG(AdamWOptions, double, weight_decay, 1e-2);
  DOPT_ARG(AdamWOptions, bool, amsgrad, false);
  DOPT_ARG(AdamWOptions, bool, maximize, false);
};

class AdamW : public BasicOptimizer<AdamW, AdamWOptions> {
 public:
  static constexpr const char* kName = "AdamW";
  using BasicOptimizer::BasicOptimizer;
  /// One parameter's lazy state and update (shared with FunctionalAdamW).
  static void init_param_state(const AdamWOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const AdamWOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
};

}  // namespace dopt::optim
