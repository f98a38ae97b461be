#include "dopt/optim/adamw.hpp"

#include "optim_util.hpp"

namespace dopt::optim {

// The hyperparameters are Adam's: one conversion instead of a second copy of Adam's key handling.
Hyperparams AdamWOptions::to_hyperparams() const { return as_adam_options().to_hyperparams(); }

void AdamWOptions::set_hyperparams(const Hyperparams& h) {
  AdamOptions a = as_adam_options();
  a.set_hyperparams(h);
  lr_ = a.lr();
  betas_ = a.betas();
  eps_ = a.eps();
  weight_decay_ = a.weight_decay();
  amsgrad_ = a.amsgrad();
  maximize_ = a.maximize();
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

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions defaults)
    : AdamW(single_group(std::move(params), "AdamW"), std::move(defaults)) {}

AdamW::AdamW(std::vector<OptimizerParamGroup> groups, AdamWOptions defaults)
    : Optimizer("AdamW", {}, std::make_unique<AdamWOptions>(std::move(defaults))) {
  init_groups(std::move(groups));
}

void AdamW::init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const {
  init_param_state(static_cast<const AdamWOptions&>(o), p, st);
}

void AdamW::update(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const {
  update_param(static_cast<const AdamWOptions&>(o), p, g, st);
}

}  // namespace dopt::optim
