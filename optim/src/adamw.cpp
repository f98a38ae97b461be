#include "dopt/optim/adamw.hpp"

#include "optim_util.hpp"

namespace dopt::optim {

AdamOptions AdamWOptions::as_adam_options() const {
  return AdamOptions(lr_).betas(betas_).eps(eps_).weight_decay(weight_decay_).amsgrad(amsgrad_).maximize(maximize_);
}

void AdamW::init_param_state(const AdamWOptions& o, const Tensor& p, ParamState& st) {
  Adam::init_param_state(o.as_adam_options(), p, st);
}

void AdamW::update_param(const AdamWOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  Adam::update_param(o.as_adam_options(), p, g, st, /*decoupled_weight_decay=*/true);
}

}  // namespace dopt::optim
