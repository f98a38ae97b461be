#include "dopt/optim/functional.hpp"
#include "dopt/optim/internal/state_check.hpp"

#include <unordered_set>

#include "dopt/optim/internal/device_step.hpp"
#include "dopt/optim/internal/param_checks.hpp"
#include "dopt/optim/internal/state_load.hpp"
#include "dopt/optim/internal/write_fence.hpp"

namespace dopt::optim {

FunctionalOptimizer::FunctionalOptimizer(std::string optimizer_name, std::vector<Tensor> params,
                                         std::unique_ptr<OptimizerOptions> options, bool allow_empty_param_list)
    : optimizer_name_(std::move(optimizer_name)),
      name_("Functional" + optimizer_name_),
      params_(std::move(params)),
      options_(std::move(options)) {
  if (params_.empty() && !allow_empty_param_list) throw ValueError(name_, "optimizer got an empty parameter list");
  std::unordered_set<const TensorImpl*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    check_param(params_[i], name_, i);
    // torch accepts duplicates; step() would then update one tensor twice
    // with two gradients and one state, which is never what was meant.
    if (!seen.insert(params_[i].key()).second)
      throw ValueError(name_, "parameter " + std::to_string(i) + " appears more than once in the parameter list");
  }
  options_->validate(name_);
}

void FunctionalOptimizer::check_param(const Tensor& p, const std::string& op, std::size_t index) const {
  if (!p.defined()) throw TypeError(op, "parameter " + std::to_string(index) + " is an undefined tensor");
  if (!is_floating_point(p.dtype()))
    throw TypeError(op, "can only optimize floating-point tensors, but parameter " + std::to_string(index) +
                            " is " + std::string(dtype_name(p.dtype())));
  detail::refuse_16bit_cpu_param(p, op, "parameter " + std::to_string(index));
  options_->check_param(p, op);
}

void FunctionalOptimizer::check_device(const Tensor& p, const std::string& op) const {
  if (!p.device().is_cpu() && !has_device_kernels())
    throw NotSupportedError(op, optimizer_name_ + " has no kernel for parameters on " + p.device().str() +
                                    " (it runs on the CPU only)");
}

void FunctionalOptimizer::init_all_state() {
  for (const Tensor& p : params_) {
    ParamState& st = state_[p.key()];
    if (st.empty()) init_param(*options_, p, st);
  }
}

ParamState& FunctionalOptimizer::state_for(const Tensor& p) {
  ParamState& st = state_[p.key()];
  if (st.empty()) init_param(*options_, p, st);
  return st;
}

void FunctionalOptimizer::step(const std::vector<Tensor>& grads) {
  dopt::detail::fence_wait();  // a background snapshot still copies the parameters or the state
  const std::string op = name_ + ".step";
  if (grads.size() != params_.size())
    throw ValueError(op, "the gradients passed in does not equal to the size of the parameters!Params length: " +
                             std::to_string(params_.size()) + ". Gradients length: " +
                             std::to_string(grads.size()));
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (grads[i].defined()) {
      check_param_grad(params_[i], grads[i], op);
      check_device(params_[i], op);
    }
  // Parameters on a device with a registered stepper (gpu/) go to it in one batch.
  std::vector<Tensor> dev_params, dev_grads;
  std::vector<ParamState*> dev_states;
  detail::DeviceStepper* stepper = nullptr;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;  // None: no state, no update
    detail::DeviceStepper* s = params_[i].device().is_cpu() ? nullptr : detail::device_stepper_for(params_[i]);
    if (s && (!stepper || s == stepper)) {
      stepper = s;
      dev_params.push_back(params_[i]);
      dev_grads.push_back(grads[i]);
      dev_states.push_back(&state_for(params_[i]));
      continue;
    }
    update_param(*options_, params_[i], grads[i], state_for(params_[i]));
  }
  if (stepper) stepper->step(*options_, dev_params, dev_grads, dev_states);
}

void FunctionalOptimizer::step_param(const Tensor& param, const Tensor& grad) {
  const std::string op = name_ + ".step_param";
  check_param(param, op, 0);
  if (!grad.defined()) return;
  check_param_grad(param, grad, op);
  check_device(param, op);
  if (!state_.count(param.key())) {
    bool known = false;
    for (const Tensor& p : params_) known = known || p.is_same(param);
    if (!known) extra_params_.push_back(param);
  }
  if (detail::DeviceStepper* s = param.device().is_cpu() ? nullptr : detail::device_stepper_for(param)) {
    s->step(*options_, {param}, {grad}, {&state_for(param)});
    return;
  }
  update_param(*options_, param, grad, state_for(param));
}

const ParamState* FunctionalOptimizer::state_of(const Tensor& param) const {
  auto it = state_.find(param.key());
  return it == state_.end() ? nullptr : &it->second;
}

std::vector<Tensor> FunctionalOptimizer::all_params() const {
  std::vector<Tensor> all = params_;
  all.insert(all.end(), extra_params_.begin(), extra_params_.end());
  return all;
}

StateDict FunctionalOptimizer::state_dict() const {
  StateDict sd;
  StateDict::Group g;
  g.hyperparams = defaults();
  const std::vector<Tensor> all = all_params();
  for (std::size_t i = 0; i < all.size(); ++i) {
    g.params.push_back(static_cast<std::int64_t>(i));
    auto it = state_.find(all[i].key());
    if (it != state_.end()) sd.state[static_cast<std::int64_t>(i)] = it->second;
  }
  sd.param_groups.push_back(std::move(g));
  return sd;
}

void FunctionalOptimizer::load_state_dict(const StateDict& sd) {
  const std::string op = name_ + ".load_state_dict";
  const std::vector<Tensor> all = all_params();
  if (sd.param_groups.size() != 1)
    throw StateDictError(op, "loaded state dict has " + std::to_string(sd.param_groups.size()) +
                                 " parameter groups; a functional optimizer has one");
  const auto& ids = sd.param_groups[0].params;
  if (ids.size() != all.size())
    throw StateDictError(op, "loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group (" + std::to_string(ids.size()) + " vs " +
                             std::to_string(all.size()) + " parameters)");
  auto opts = options_->clone();
  opts->set_hyperparams(sd.param_groups[0].hyperparams);
  opts->validate(name_);
  StateMap fresh;
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto it = sd.state.find(ids[i]);
    if (it == sd.state.end()) continue;
    ParamState st;
    for (const auto& [k, v] : it->second) {
      if (!v.defined()) throw StateDictError(op, "state '" + k + "' of parameter " + std::to_string(ids[i]) + " is undefined");
      check_state_value(op, "state '" + k + "' of parameter " + std::to_string(ids[i]), k, v);
      st[k] = detail::load_state_value(all[i], k, v, /*cast_integers=*/false);
    }
    fresh[all[i].key()] = std::move(st);
  }
  options_ = std::move(opts);
  state_ = std::move(fresh);
}

void FunctionalOptimizer::set_defaults(const Hyperparams& h) {
  auto opts = options_->clone();
  opts->set_hyperparams(h);
  opts->validate(name_);
  options_ = std::move(opts);
}

void FunctionalOptimizer::set_lr(double lr) {
  auto opts = options_->clone();
  opts->set_lr(lr);
  opts->validate(name_);
  options_ = std::move(opts);
}

}  // namespace dopt::optim
