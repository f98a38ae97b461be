#pragma once
// Functional optimizers: torch.distributed.optim's _FunctionalSGD, ...Adam,
// ...AdamW, ...Adagrad, ...RMSprop, ...Adamax, ...Adadelta, ...Rprop (1.13;
// plus FunctionalNAdam, FunctionalRAdam and FunctionalMuon, which torch 1.13
// lacks; see docs/optimizers.md). Used where gradients do not live in
// param.grad(): DistributedOptimizer's remote side, ZeRO with
// overlap_with_ddp, DDP optimizer-overlap hooks.
//
// Contract:
//  - Constructed from a list of parameters and the options of the matching
//    torch.optim class (AdamOptions, ...). There is exactly one set of
//    hyperparameters (torch's `defaults`); no param groups.
//  - step(grads) takes one gradient per parameter, in the order of params();
//    an undefined Tensor is torch's None: that parameter is skipped (no state
//    created, no update). It never reads or writes param.grad().
//  - step_param(param, grad) updates one parameter, which need not be in
//    params() (as_functional_optim builds optimizers without params).
//  - The state is held by the functional optimizer, keyed by parameter
//    identity (Tensor::key()), apart from the parameters; it is the same
//    per-parameter state the torch.optim class keeps, created and updated by
//    the class's static init_param_state/update_param, so a functional
//    optimizer and the class fed the same gradients give bitwise the same
//    parameters and state.
//  - Not thread-safe: one thread at a time.
//
// Where torch 1.13's functional forms differ from the torch.optim classes,
// dopt follows the classes (docs/torch-differences.md): FunctionalAdamax's lr
// defaults to 2e-3, FunctionalAdadelta counts `step`, FunctionalAdagrad
// skips None gradients correctly, step counters have the class's dtype
// (float32 for Adam/AdamW/Adamax/Adagrad, int64 for RMSprop/Adadelta/Rprop),
// every class validates its options as the torch.optim class does, and every
// class has step_param.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dopt/optim/adadelta.hpp"
#include "dopt/optim/adagrad.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/adamax.hpp"
#include "dopt/optim/adamw.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/optim/nadam.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/optim/radam.hpp"
#include "dopt/optim/rmsprop.hpp"
#include "dopt/optim/rprop.hpp"
#include "dopt/optim/sgd.hpp"

namespace dopt::optim {

class FunctionalOptimizer {
 public:
  using StateMap = std::unordered_map<const TensorImpl*, ParamState>;

  virtual ~FunctionalOptimizer() = default;
  FunctionalOptimizer(const FunctionalOptimizer&) = delete;
  FunctionalOptimizer& operator=(const FunctionalOptimizer&) = delete;

  /// "FunctionalAdam", ... (torch: _FunctionalAdam); names errors.
  const std::string& name() const noexcept { return name_; }
  /// The torch.optim class this is the functional form of: "Adam", ...
  const std::string& optimizer_name() const noexcept { return optimizer_name_; }

  /// The parameters given to the constructor, in order.
  const std::vector<Tensor>& params() const noexcept { return params_; }

  /// Updates params()[i] from grads[i] for every defined grads[i]. Throws
  /// dopt::ValueError "the gradients passed in does not equal to the size of
  /// the parameters!Params length: N. Gradients length: M" for a length
  /// mismatch, and ShapeError/DTypeError/DeviceError for a gradient that does
  /// not fit its parameter; all gradients are checked before any update.
  void step(const std::vector<Tensor>& grads);
  /// Updates one parameter (in params() or not); an undefined grad does
  /// nothing. The optimizer keeps a handle to a parameter it did not get in
  /// the constructor, so that its state stays attached to it.
  void step_param(const Tensor& param, const Tensor& grad);

  /// Per-parameter state, keyed by Tensor::key().
  StateMap& state() noexcept { return state_; }
  const StateMap& state() const noexcept { return state_; }
  /// The state of `param`, or nullptr when it has none yet.
  const ParamState* state_of(const Tensor& param) const;

  /// torch's layout with one group: ids are positions in params(), followed
  /// by the parameters first seen in step_param, in that order. State tensors
  /// are shared, not copied.
  StateDict state_dict() const;
  /// Loads a dict of the layout above: exactly one group with as many ids as
  /// there are parameters (dopt::StateDictError otherwise). State tensors are
  /// copied and cast to the parameter's dtype (except `step`); the dict's
  /// hyperparameters replace the options (validated first).
  void load_state_dict(const StateDict& sd);

  /// The hyperparameters (torch's `defaults`), under torch's names.
  Hyperparams defaults() const { return options_->to_hyperparams(); }
  /// Overwrites the given hyperparameters; unknown keys, wrong kinds and
  /// invalid values throw (and change nothing).
  void set_defaults(const Hyperparams& h);
  const OptimizerOptions& options() const noexcept { return *options_; }
  double lr() const { return options_->get_lr(); }
  /// Sets the learning rate (validated: lr < 0 is a ValueError).
  void set_lr(double lr);

 protected:
  /// `optimizer_name` is the torch.optim class name ("Adam"). Throws
  /// ValueError for an empty list unless allow_empty_param_list, for a
  /// parameter listed twice and for invalid options; TypeError for an
  /// undefined or non-floating-point parameter.
  FunctionalOptimizer(std::string optimizer_name, std::vector<Tensor> params,
                      std::unique_ptr<OptimizerOptions> options, bool allow_empty_param_list);

  virtual void init_param(const OptimizerOptions& o, const Tensor& p, ParamState& st) const = 0;
  virtual void update_param(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const = 0;
  /// Creates the state of every parameter now (Adagrad's constructor).
  void init_all_state();
  /// Whether parameters off the CPU may go to a registered device stepper
  /// (false for NAdam and RAdam: step() and step_param() then refuse them
  /// with NotSupportedError naming the optimizer, before any update).
  virtual bool has_device_kernels() const noexcept { return true; }

 private:
  void check_param(const Tensor& p, const std::string& op, std::size_t index) const;
  void check_device(const Tensor& p, const std::string& op) const;
  ParamState& state_for(const Tensor& p);
  /// params_ followed by extra_params_.
  std::vector<Tensor> all_params() const;

  std::string optimizer_name_;
  std::string name_;
  std::vector<Tensor> params_;
  std::vector<Tensor> extra_params_;  // seen first in step_param; kept alive
  std::unique_ptr<OptimizerOptions> options_;
  StateMap state_;
};

/// The functional form of optimizer class Opt (Adam, SGD, ...), calling its
/// static init_param_state/update_param. An Opt with
/// `static constexpr bool kEagerState = true` (Adagrad) has the state of every
/// parameter made in the constructor, as torch; a parameter first seen in
/// step_param gets its state then.
template <class Opt>
class BasicFunctional final : public FunctionalOptimizer {
 public:
  using OptimizerClass = Opt;
  using Options = typename Opt::Options;
  explicit BasicFunctional(std::vector<Tensor> params, const Options& options = Options(),
                           bool allow_empty_param_list = false)
      : FunctionalOptimizer(Opt::kName, std::move(params), std::make_unique<Options>(options),
                            allow_empty_param_list) {
    if constexpr (requires { Opt::kEagerState; }) {
      if (Opt::kEagerState) init_all_state();
    }
  }
  const Options& options() const noexcept {
    return static_cast<const Options&>(FunctionalOptimizer::options());
  }

 protected:
  void init_param(const OptimizerOptions& o, const Tensor& p, ParamState& st) const override {
    OptimizerStatics<Opt>::init(o, p, st);
  }
  void update_param(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const override {
    OptimizerStatics<Opt>::update(o, p, g, st);
  }
  bool has_device_kernels() const noexcept override { return OptimizerStatics<Opt>::device_kernels(); }
};

/// torch's _FunctionalSGD. lr is required, as for torch.optim.SGD (torch's
/// functional form defaults it to 1e-2).
using FunctionalSGD = BasicFunctional<SGD>;
using FunctionalAdam = BasicFunctional<Adam>;
using FunctionalAdamW = BasicFunctional<AdamW>;
/// torch's _FunctionalAdagrad: state for every parameter from the
/// constructor. torch's unused warmup_lr_multiplier, warmup_num_iters and
/// coalesce_grad do not exist here.
using FunctionalAdagrad = BasicFunctional<Adagrad>;
using FunctionalRMSprop = BasicFunctional<RMSprop>;
/// torch's _FunctionalAdamax, with torch.optim.Adamax's lr default 2e-3
/// (torch's functional form: 1e-3).
using FunctionalAdamax = BasicFunctional<Adamax>;
/// torch's _FunctionalAdadelta; `step` counts (torch 1.13's stays 0).
using FunctionalAdadelta = BasicFunctional<Adadelta>;
using FunctionalRprop = BasicFunctional<Rprop>;
/// The functional forms of NAdam, RAdam (CPU parameters only) and Muon (2-D
/// CPU parameters only), which torch 1.13 lacks.
using FunctionalNAdam = BasicFunctional<NAdam>;
using FunctionalRAdam = BasicFunctional<RAdam>;
using FunctionalMuon = BasicFunctional<Muon>;

}  // namespace dopt::optim
