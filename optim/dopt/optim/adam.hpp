#pragma once
// torch.optim.Adam (1.13), float32/float64 results bit-identical to torch's
// single-tensor path.
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class AdamOptions : public OptionsCRTP<AdamOptions> {
 public:
  explicit AdamOptions(double lr = 1e-3) : lr_(lr) {}
  static constexpr const char* kName = "AdamOptions";
  static std::vector<HyperField<AdamOptions>> fields();
  void validate(const std::string& op) const override;

  DOPT_ARG(AdamOptions, double, lr, 1e-3);
  DOPT_ARG(AdamOptions, Pair, betas, (Pair{0.9, 0.999}));
  DOPT_ARG(AdamOptions, double, eps, 1e-8);
  DOPT_ARG(AdamOptions, double, weight_decay, 0.0);
  DOPT_ARG(AdamOptions, bool, amsgrad, false);
  DOPT_ARG(AdamOptions, bool, maximize, false);
};

class Adam : public BasicOptimizer<Adam, AdamOptions> {
 public:
  static constexpr const char* kName = "Adam";
  using BasicOptimizer::BasicOptimizer;
  /// One parameter's lazy state and update (shared with FunctionalAdam).
  static void init_param_state(const AdamOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const AdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st,
                           bool decoupled_weight_decay = false);
};

}  // namespace dopt::optim
