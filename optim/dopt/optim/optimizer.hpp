#pragma once
// The local optimizer base class, with torch 1.13's param-group and
// state-dict semantics (torch.optim.Optimizer).
//
// Contract:
//  - An optimizer holds Tensor handles to its parameters; it updates them in
//    place in step(). Gradients are read from param.grad(); a parameter whose
//    grad is undefined is skipped entirely (no update, no state).
//  - Not thread-safe: one thread at a time calls step(), zero_grad(),
//    add_param_group(), state_dict() and load_state_dict(). With
//    set_num_threads(n > 1), step() spreads the parameters over n threads
//    (the caller's included) and returns when all are done.
//  - Errors a user can cause throw dopt::Error subclasses naming the optimizer.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dopt/runtime/hyperparams.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim {

using dopt::ParamState;
using dopt::StateDict;

/// Hyperparameters of one param group. Each optimizer has its own subclass
/// (AdamOptions, SGDOptions, ...) with chainable setters named as in torch.
class OptimizerOptions {
 public:
  virtual ~OptimizerOptions() = default;
  virtual std::unique_ptr<OptimizerOptions> clone() const = 0;
  /// Every hyperparameter under torch's name.
  virtual Hyperparams to_hyperparams() const = 0;
  /// Overwrites the keys present in h. Unknown keys raise dopt::ValueError;
  /// values of the wrong kind raise dopt::TypeError.
  virtual void set_hyperparams(const Hyperparams& h) = 0;
  /// Throws dopt::ValueError, naming `op`, for invalid values (torch's checks).
  virtual void validate(const std::string& op) const = 0;
  virtual double get_lr() const = 0;
  virtual void set_lr(double lr) = 0;
  /// Throws dopt::ValueError, naming `op`, for a parameter this optimizer
  /// cannot take (Muon: anything but a matrix). Called for every parameter
  /// added to an optimizer, a functional optimizer or ZeRO. Default: any.
  virtual void check_param(const Tensor& /*param*/, const std::string& /*op*/) const {}
  /// The relative work of one step on a parameter of this shape, in
  /// multiply-adds (ZeRO's cost-weighted partition). Default: the element
  /// count; Muon: its Newton-Schulz iteration.
  virtual double step_cost(const Shape& shape) const { return static_cast<double>(shape_numel(shape)); }
};

/// A parameter group: parameters plus (optionally) their own options. Options
/// left null take the optimizer's defaults when the group is added.
struct OptimizerParamGroup {
  std::vector<Tensor> params;
  std::unique_ptr<OptimizerOptions> options;
  /// torch's param_group['initial_lr']: set by the first learning-rate
  /// scheduler built on the optimizer (lr_scheduler.hpp), read by later ones.
  std::optional<double> initial_lr;

  OptimizerParamGroup(std::vector<Tensor> p) : params(std::move(p)) {}  // NOLINT(implicit)
  OptimizerParamGroup(std::vector<Tensor> p, std::unique_ptr<OptimizerOptions> o)
      : params(std::move(p)), options(std::move(o)) {}
  template <class Opt, class = std::enable_if_t<std::is_base_of_v<OptimizerOptions, Opt>>>
  OptimizerParamGroup(std::vector<Tensor> p, const Opt& o)
      : params(std::move(p)), options(std::make_unique<Opt>(o)) {}
  OptimizerParamGroup(const OptimizerParamGroup& o)
      : params(o.params), options(o.options ? o.options->clone() : nullptr), initial_lr(o.initial_lr) {}
  OptimizerParamGroup& operator=(const OptimizerParamGroup& o) {
    params = o.params;
    options = o.options ? o.options->clone() : nullptr;
    initial_lr = o.initial_lr;
    return *this;
  }
  OptimizerParamGroup(OptimizerParamGroup&&) noexcept = default;
  OptimizerParamGroup& operator=(OptimizerParamGroup&&) noexcept = default;

  template <class Opt> Opt& options_as() { return dynamic_cast<Opt&>(*options); }
  template <class Opt> const Opt& options_as() const { return dynamic_cast<const Opt&>(*options); }
};

/// The one group made from a plain parameter list; an empty list is torch's
/// ValueError "optimizer got an empty parameter list" (naming `name`).
std::vector<OptimizerParamGroup> single_group(std::vector<Tensor> params, const std::string& name);

class Optimizer {
 public:
  using LossClosure = std::function<double()>;

  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// The torch class name: "Adam", "SGD", ...
  const std::string& name() const noexcept { return name_; }

  /// Runs the closure (if any) to recompute the loss, then updates every
  /// parameter that has a gradient. Returns the closure's loss.
  std::optional<double> step(const LossClosure& closure = nullptr);

  /// Adds a group; options not given are filled from defaults(). An empty
  /// group is allowed (as in torch). Throws dopt::ValueError for a parameter
  /// already in another group, an undefined tensor, a non-float parameter or
  /// invalid hyperparameters.
  void add_param_group(OptimizerParamGroup group);

  /// Clears every parameter's gradient: set to undefined, or zero in place.
  void zero_grad(bool set_to_none = false);

  std::vector<OptimizerParamGroup>& param_groups() noexcept { return param_groups_; }
  const std::vector<OptimizerParamGroup>& param_groups() const noexcept { return param_groups_; }
  /// State keyed by parameter identity (Tensor::key()).
  std::unordered_map<const TensorImpl*, ParamState>& state() noexcept { return state_; }
  const std::unordered_map<const TensorImpl*, ParamState>& state() const noexcept { return state_; }
  const OptimizerOptions& defaults() const noexcept { return *defaults_; }
  OptimizerOptions& defaults() noexcept { return *defaults_; }

  /// torch's layout; state tensors are shared (not copied), like torch.
  StateDict state_dict() const;
  /// torch's validation: group count and sizes must match
  /// (dopt::StateDictError otherwise). State tensors are copied and cast to the
  /// parameter's dtype (except `step`); hyperparameters come from the dict.
  void load_state_dict(const StateDict& sd);

  /// Threads used by step() to spread parameters over (1 = the caller only).
  void set_num_threads(int n);
  int num_threads() const noexcept { return num_threads_; }

  /// Every parameter of every group, in group order.
  std::vector<Tensor> all_params() const;

  /// One parameter's update, as step() would run it (on the tensors given).
  using UpdateFn = std::function<void(const Tensor& param, const Tensor& grad, ParamState& state)>;
  /// Wraps each CPU parameter's update in step(): called with the group's
  /// options, the parameter, its gradient, its state (already initialised)
  /// and the update, which the hook runs on them or on parts of them (for an
  /// elementwise optimizer, slices of the parameter, gradient and full-size
  /// state entries update like the whole). While a hook is set, step()
  /// updates CPU parameters one at a time, in group order, on the calling
  /// thread. ZeroRedundancyOptimizer's host-memory redundancy journals the
  /// updates with it. Empty: no hook.
  using UpdateHook = std::function<void(const OptimizerOptions& options, const Tensor& param, const Tensor& grad,
                                        ParamState& state, const UpdateFn& update)>;
  void set_update_hook(UpdateHook hook) { update_hook_ = std::move(hook); }

 protected:
  Optimizer(std::string name, std::vector<OptimizerParamGroup> groups,
            std::unique_ptr<OptimizerOptions> defaults);
  /// Subclass constructors call this last (it runs the virtual hooks).
  void init_groups(std::vector<OptimizerParamGroup> groups);

  /// Creates the lazy state of p at its first step with a gradient.
  virtual void init_state(const OptimizerOptions& options, const Tensor& param,
                          ParamState& state) const = 0;
  /// Updates one parameter from its gradient. Called concurrently for distinct
  /// parameters, so it may touch only p, g and st.
  virtual void update(const OptimizerOptions& options, const Tensor& param, const Tensor& grad,
                      ParamState& state) const = 0;
  /// Called for each group as it is added, after defaults are filled in
  /// (Adagrad creates its state here).
  virtual void on_group_added(OptimizerParamGroup& /*group*/) {}
  /// Whether parameters off the CPU may go to a registered device stepper
  /// (gpu/). An optimizer without device kernels (NAdam, RAdam) returns
  /// false: step() then refuses such parameters with NotSupportedError
  /// naming the optimizer, before changing anything.
  virtual bool has_device_kernels() const noexcept { return true; }

 private:
  std::string name_;
  std::unique_ptr<OptimizerOptions> defaults_;
  std::vector<OptimizerParamGroup> param_groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
  int num_threads_ = 1;
  UpdateHook update_hook_;
};

/// Checks the (param, grad) pair an update receives: same shape, dtype and
/// device, float dtype, CPU or a device with kernels. Throws naming `op`.
void check_param_grad(const Tensor& param, const Tensor& grad, const std::string& op);

}  // namespace dopt::optim
