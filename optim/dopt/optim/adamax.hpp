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
 public:
  explicit AdamaxOptions(double lr = 2e-3) : lr_(lr) {}
  static constexpr const char* kName = "AdamaxOptions";
  static std::vector<HyperField<AdamaxOptions>> fields();
  /// torch's checks: lr >= 0, eps >= 0, 0 <= betas[i] < 1, weight_decay >= 0.
  void validate(const std::string& op) const override;

  DOPT_ARG(AdamaxOptions, double, lr, 2e-3);
  DOPT_ARG(AdamaxOptions, Pair, betas, (Pair{0.9, 0.999}));
  DOPT_ARG(AdamaxOptions, double, eps, 1e-8);
  DOPT_ARG(AdamaxOptions, double, weight_decay, 0.0);
  DOPT_ARG(AdamaxOptions, bool, maximize, false);
};

class Adamax : public BasicOptimizer<Adamax, AdamaxOptions> {
 public:
  static constexpr const char* kName = "Adamax";
  using BasicOptimizer::BasicOptimizer;
  /// One parameter's lazy state and update (shared with FunctionalAdamax).
  /// update_param expects a grad that matches p (check_param_grad) and the
  /// state made by init_param_state; a state lacking an entry, or whose
  /// tensors do not match p, is a dopt::StateError.
  static void init_param_state(const AdamaxOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const AdamaxOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
};

}  // namespace dopt::optim
