#include "dopt/optim/optimizer.hpp"
#include "dopt/optim/internal/state_check.hpp"

#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include "dopt/optim/internal/device_step.hpp"
#include "dopt/runtime/internal/parallel.hpp"
#include "dopt/optim/internal/param_checks.hpp"
#include "dopt/optim/internal/state_load.hpp"
#include "dopt/optim/internal/write_fence.hpp"

namespace dopt::optim {

namespace detail {

std::int64_t parse_count(const std::string& s, const std::string& op, const std::string& what) {
  std::size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || v < 0)
    throw StateDictError(op, what + " '" + s + "' is not a non-negative integer");
  return v;
}

Tensor load_state_value(const Tensor& param, const std::string& key, const Tensor& value, bool cast_integers) {
  if (key == "step") return value.clone();
  const bool low = param.dtype() == DType::float16 || param.dtype() == DType::bfloat16;
  DType dt = value.dtype();
  if (key == "master_param") dt = DType::float32;
  else if (is_floating_point(value.dtype())) dt = low && value.dtype() == DType::float32 ? DType::float32 : param.dtype();
  else if (cast_integers) dt = param.dtype();
  Tensor t = Tensor::empty(value.shape(), dt, param.device());
  t.copy_(value);
  return t;
}

std::vector<std::unique_ptr<OptimizerOptions>> loaded_options(const std::vector<OptimizerParamGroup>& groups,
                                                              const std::function<Hyperparams(std::size_t)>& hyper,
                                                              const std::string& op) {
  std::vector<std::unique_ptr<OptimizerOptions>> opts;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto o = groups[g].options->clone();
    o->set_hyperparams(hyper(g));
    o->validate(op);
    opts.push_back(std::move(o));
  }
  return opts;
}

}  // namespace detail

void check_param_grad(const Tensor& param, const Tensor& grad, const std::string& op) {
  if (grad.shape() != param.shape())
    throw ShapeError(op, "gradient shape " + shape_str(grad.shape()) + " does not match parameter shape " +
                             shape_str(param.shape()));
  if (grad.dtype() != param.dtype())
    throw DTypeError(op, "gradient dtype " + std::string(dtype_name(grad.dtype())) +
                             " does not match parameter dtype " + std::string(dtype_name(param.dtype())));
  if (grad.device() != param.device())
    throw DeviceError(op, "gradient on " + grad.device().str() + " but parameter on " + param.device().str());
}

std::vector<OptimizerParamGroup> single_group(std::vector<Tensor> params, const std::string& name) {
  if (params.empty()) throw ValueError(name, "optimizer got an empty parameter list");
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::move(params));
  return groups;
}

Optimizer::Optimizer(std::string name, std::vector<OptimizerParamGroup> /*groups*/,
                     std::unique_ptr<OptimizerOptions> defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {
  defaults_->validate(name_);
}

void Optimizer::init_groups(std::vector<OptimizerParamGroup> groups) {
  if (groups.empty()) throw ValueError(name_, "optimizer got an empty parameter list");
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(OptimizerParamGroup group) {
  const std::string op = name_ + ".add_param_group";
  std::unordered_map<const TensorImpl*, std::pair<std::size_t, std::size_t>> existing;  // -> (group, index)
  for (std::size_t g = 0; g < param_groups_.size(); ++g)
    for (std::size_t k = 0; k < param_groups_[g].params.size(); ++k)
      existing.emplace(param_groups_[g].params[k].key(), std::make_pair(g, k));
  std::unordered_map<const TensorImpl*, std::size_t> in_group;
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    if (!p.defined()) throw TypeError(op, "parameter " + std::to_string(i) + " of the group is an undefined tensor");
    if (!is_floating_point(p.dtype()))
      throw TypeError(op, "can only optimize floating-point tensors, but parameter " + std::to_string(i) +
                              " is " + std::string(dtype_name(p.dtype())));
    detail::refuse_16bit_cpu_param(p, op, "parameter " + std::to_string(i) + " of the group");
    if (auto e = existing.find(p.key()); e != existing.end())
      throw ValueError(op, "some parameters appear in more than one parameter group: parameter " + std::to_string(i) +
                               " of the new group is parameter " + std::to_string(e->second.second) + " of group " +
                               std::to_string(e->second.first));
    // torch warns about a duplicate inside one group, keeps it and steps it
    // twice; neither stepping it once nor twice is what was meant.
    if (auto [it, fresh] = in_group.emplace(p.key(), i); !fresh)
      throw ValueError(op, detail::duplicate_param_text(i, it->second, p));
  }
  if (!group.options) {
    group.options = defaults_->clone();
  } else if (typeid(*group.options) != typeid(*defaults_)) {
    throw TypeError(op, "the group's options are not " + name_ + "'s options type");
  }
  group.options->validate(name_);
  for (const auto& p : group.params) group.options->check_param(p, name_);
  param_groups_.push_back(std::move(group));
  on_group_added(param_groups_.back());
}

std::optional<double> Optimizer::step(const LossClosure& closure) {
  dopt::detail::fence_wait();  // a background snapshot of the state still copies it
  std::optional<double> loss;
  if (closure) loss = closure();
  struct Item {
    const OptimizerOptions* options;
    Tensor param;
    Tensor grad;
    ParamState* state;
  };
  std::vector<Item> items;
  if (!has_device_kernels()) {
    for (auto& g : param_groups_)
      for (auto& p : g.params)
        if (p.grad().defined() && !p.device().is_cpu())
          throw NotSupportedError(name_ + ".step", name_ + " has no kernel for parameters on " + p.device().str() +
                                                       " (it runs on the CPU only)");
  }
  for (auto& g : param_groups_) {
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      check_param_grad(p, grad, name_ + ".step");
      ParamState& st = state_[p.key()];
      if (st.empty()) init_state(*g.options, p, st);
      items.push_back(Item{g.options.get(), p, std::move(grad), &st});
    }
  }
  // Parameters on a device with a registered stepper (gpu/: fused CUDA
  // kernels) go to it, one batch per group; the rest take the CPU kernels.
  struct Batch {
    const OptimizerOptions* options;
    detail::DeviceStepper* stepper;
    std::vector<Tensor> params, grads;
    std::vector<ParamState*> states;
  };
  std::vector<Batch> batches;
  std::vector<Item> host;
  for (auto& it : items) {
    detail::DeviceStepper* s = it.param.device().is_cpu() ? nullptr : detail::device_stepper_for(it.param);
    if (!s) {
      host.push_back(std::move(it));
      continue;
    }
    if (batches.empty() || batches.back().options != it.options || batches.back().stepper != s)
      batches.push_back(Batch{it.options, s, {}, {}, {}});
    batches.back().params.push_back(it.param);
    batches.back().grads.push_back(it.grad);
    batches.back().states.push_back(it.state);
  }
  for (const Batch& b : batches) b.stepper->step(*b.options, b.params, b.grads, b.states);
  if (update_hook_) {
    for (const Item& it : host) {
      const OptimizerOptions& o = *it.options;
      update_hook_(o, it.param, it.grad, *it.state,
                   [&](const Tensor& p, const Tensor& g, ParamState& st) { update(o, p, g, st); });
    }
    return loss;
  }
  parallel_for(static_cast<std::int64_t>(host.size()), num_threads_, [&](std::int64_t i) {
    const Item& it = host[static_cast<std::size_t>(i)];
    update(*it.options, it.param, it.grad, *it.state);
  });
  return loss;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : param_groups_)
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none) p.set_grad(Tensor());
      else grad.zero_();
    }
}

std::vector<Tensor> Optimizer::all_params() const {
  std::vector<Tensor> out;
  for (const auto& g : param_groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

void Optimizer::set_num_threads(int n) {
  if (n < 1) throw ValueError(name_ + ".set_num_threads", "thread count must be >= 1, got " + std::to_string(n));
  num_threads_ = n;
}

StateDict Optimizer::state_dict() const {
  StateDict sd;
  std::unordered_map<const TensorImpl*, std::int64_t> ids;
  std::int64_t next = 0;
  for (const auto& g : param_groups_) {
    StateDict::Group out;
    out.hyperparams = g.options->to_hyperparams();
    for (const auto& p : g.params) {
      auto [it, fresh] = ids.emplace(p.key(), next);
      if (fresh) ++next;
      out.params.push_back(it->second);
    }
    sd.param_groups.push_back(std::move(out));
  }
  for (const auto& [key, st] : state_) {
    auto it = ids.find(key);
    if (it != ids.end()) sd.state[it->second] = st;
  }
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  const std::string op = name_ + ".load_state_dict";
  if (sd.param_groups.size() != param_groups_.size())
    throw StateDictError(op, "loaded state dict has a different number of parameter groups (" +
                                 std::to_string(sd.param_groups.size()) + " vs " +
                                 std::to_string(param_groups_.size()) + ")");
  for (std::size_t gi = 0; gi < param_groups_.size(); ++gi) {
    if (sd.param_groups[gi].params.size() != param_groups_[gi].params.size())
      throw StateDictError(op, "loaded state dict contains a parameter group that doesn't match the size of "
                               "optimizer's group (group " + std::to_string(gi) + ": " +
                               std::to_string(sd.param_groups[gi].params.size()) + " vs " +
                               std::to_string(param_groups_[gi].params.size()) + " parameters)");
  }
  // Map saved ids to current params positionally over the chained groups.
  std::map<std::int64_t, Tensor> id_to_param;
  for (std::size_t gi = 0; gi < param_groups_.size(); ++gi)
    for (std::size_t k = 0; k < param_groups_[gi].params.size(); ++k)
      id_to_param.emplace(sd.param_groups[gi].params[k], param_groups_[gi].params[k]);

  // Build everything first, then commit: a failure leaves the optimizer unchanged.
  std::unordered_map<const TensorImpl*, ParamState> new_state;
  for (const auto& [id, st] : sd.state) {
    auto it = id_to_param.find(id);
    if (it == id_to_param.end())
      throw StateDictError(op, "state for parameter id " + std::to_string(id) +
                                   " that no parameter group lists");
    const Tensor& p = it->second;
    ParamState copy;
    for (const auto& [key, value] : st) {
      if (!value.defined()) continue;
      check_state_value(op, "state '" + key + "' of parameter id " + std::to_string(id), key, value);
      if (key == "step") {
        copy[key] = value.clone();
        continue;
      }
      if (value.dim() != 0 && value.shape() != p.shape())
        throw StateDictError(op, "state '" + key + "' of parameter id " + std::to_string(id) + " has shape " +
                                     shape_str(value.shape()) + " but the parameter has shape " +
                                     shape_str(p.shape()));
      copy[key] = detail::load_state_value(p, key, value, /*cast_integers=*/true);
    }
    new_state[p.key()] = std::move(copy);
  }
  auto new_options =
      detail::loaded_options(param_groups_, [&](std::size_t g) { return sd.param_groups[g].hyperparams; }, op);
  state_ = std::move(new_state);
  for (std::size_t gi = 0; gi < param_groups_.size(); ++gi) param_groups_[gi].options = std::move(new_options[gi]);
}

}  // namespace dopt::optim
