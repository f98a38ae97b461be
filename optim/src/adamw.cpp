#include "dopt/optim/adamw.hpp"

#include "optim_util.hpp"

namespace dopt::optim {

std::vector<HyperField<AdamWOptions>> AdamWOptions::fields() {
  return {{"lr", &AdamWOptions::lr_},
          {"betas", &AdamWOptions::betas_},
          {"eps", &AdamWOptions::eps_},
          {"weight_decay", &AdamWOptions::weight_decay_},
          {"amsgrad", &AdamWOptions::amsgrad_},
          {"maximize", &AdamWOptions::maximize_}};
}

void AdamWOptions::validate(const std::string& op) const { as_adam_options().validate(op); }

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
