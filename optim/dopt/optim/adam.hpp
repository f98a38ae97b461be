#pragma once
// torch.optim.Adam (1.13), float32/float64 results bit-identical to torch's
// single-tensor path.
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class AdamOptions : public OptionsCRTP<AdamOptions> {
  DOPT_OPTIONS(AdamOptions);
  DOPT_ARG(AdamOptions, double, lr, 1e-3, checks::NonNegative{"learning rate"});
  DOPT_ARG(AdamOptions, Pair, betas, (Pair{0.9, 0.999}), checks::Betas{});
  DOPT_ARG(AdamOptions, double, eps, 1e-8, checks::NonNegative{"epsilon value"});
  DOPT_ARG(AdamOptions, double, weight_decay, 0.0, checks::NonNegative{"weight_decay value"});
  DOPT_ARG(AdamOptions, bool, amsgrad, false);
  DOPT_ARG(AdamOptions, bool, maximize, false);
};

class Adam : public BasicOptimizer<Adam, AdamOptions> {
  DOPT_OPTIMIZER(Adam, AdamOptions);
  /// update_param with AdamW's decoupled weight decay when asked (AdamW's step).
  static void update_param(const AdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st,
                           bool decoupled_weight_decay);
};

}  // namespace dopt::optim
