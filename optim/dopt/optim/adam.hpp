#pragma once
// torch.optim.Adam (1.13), float32/float64 results bit-identical to torch's
// single-tensor path.
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class AdamOptions : public OptionsCRTP<AdamOptions> {
  DOPT_OPTIONS_WITH_LR(AdamOptions, 1e-3);
  DOPT_ADAM_ARGS(AdamOptions, 0.0);
  DOPT_ARG(AdamOptions, bool, amsgrad, false);
  DOPT_ARG_MAXIMIZE(AdamOptions);
};

class Adam : public BasicOptimizer<Adam, AdamOptions> {
  DOPT_OPTIMIZER(Adam, AdamOptions);
  /// update_param with AdamW's decoupled weight decay when asked (AdamW's step).
  static void update_param(const AdamOptions& o, const Tensor& p, const Tensor& g, ParamState& st,
                           bool decoupled_weight_decay);
};

}  // namespace dopt::optim
