#pragma once
// Optimizers by name: torch's functional_optim_map / as_functional_optim /
// register_functional_optim, plus building local
// optimizers and options from a serialisable spec (sent over the network by
// DistributedOptimizer and ZeRO).
//
// Built in: SGD, Adam, AdamW, Adagrad, RMSprop, Adamax, Adadelta, Rprop,
// NAdam, RAdam, Muon, each with its functional form. The registry is process-wide and thread-safe.
// Names are looked up exactly first, then case-insensitively ("adamw" finds
// AdamW), for command-line flags and config files.
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "dopt/optim/functional.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/runtime/hyperparams.hpp"

namespace dopt::optim {

/// An optimizer class by torch name plus hyperparameters under torch's names;
/// keys not given take the class's defaults.
struct OptimizerSpec {
  std::string name;
  Hyperparams hyperparameters;

  /// {"name": "Adam", "hyperparameters": {"lr": 0.001, "betas": [0.9, 0.999]}}.
  /// Numbers round-trip exactly; a non-finite number is a dopt::ValueError
  /// (JSON has none).
  std::string to_json() const;
  /// Parses to_json's text. Malformed JSON, a missing or non-string "name",
  /// a non-object "hyperparameters" (may be absent: empty), unknown top-level
  /// keys or unsupported value kinds raise dopt::ValueError. The name and the
  /// keys are not checked against the registry here.
  static OptimizerSpec from_json(const std::string& json);

  bool operator==(const OptimizerSpec&) const = default;
};

/// How to build one registered optimizer.
struct OptimizerFactories {
  /// Options from hyperparameters: missing keys take defaults, unknown keys
  /// throw dopt::ValueError naming the key, wrong kinds dopt::TypeError.
  std::function<std::unique_ptr<OptimizerOptions>(const Hyperparams&)> options;
  /// The local optimizer over `groups` with `defaults` (made by `options`).
  std::function<std::unique_ptr<Optimizer>(std::vector<OptimizerParamGroup> groups,
                                           const OptimizerOptions& defaults)>
      optimizer;
  /// The functional form; may be empty (then as_functional_optim refuses it).
  std::function<std::unique_ptr<FunctionalOptimizer>(std::vector<Tensor> params, const OptimizerOptions& options,
                                                     bool allow_empty_param_list)>
      functional;
  /// typeid of the options type (set by optimizer_factories): lets spec_of
  /// find the optimizer of typed options. May be left null.
  const std::type_info* options_type = nullptr;
};

/// Factories for an optimizer class Opt (with Opt::Options, constructors from
/// groups + options) and, unless void, its functional form F (constructor
/// from params + options + allow_empty_param_list). `options` is left empty
/// when Opt::Options has no default constructor.
template <class Opt, class F = void>
OptimizerFactories optimizer_factories() {
  using O = typename Opt::Options;
  OptimizerFactories f;
  f.options_type = &typeid(O);
  if constexpr (std::is_default_constructible_v<O>) {
    f.options = [](const Hyperparams& h) -> std::unique_ptr<OptimizerOptions> {
      auto o = std::make_unique<O>();
      o->set_hyperparams(h);
      return o;
    };
  }  // else the caller sets f.options (e.g. SGD: lr is required)
  f.optimizer = [](std::vector<OptimizerParamGroup> groups, const OptimizerOptions& d) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Opt>(std::move(groups), static_cast<const O&>(d));
  };
  if constexpr (!std::is_void_v<F>) {
    f.functional = [](std::vector<Tensor> params, const OptimizerOptions& o,
                      bool allow_empty) -> std::unique_ptr<FunctionalOptimizer> {
      return std::make_unique<F>(std::move(params), static_cast<const O&>(o), allow_empty);
    };
  }
  return f;
}

/// Registers `name` unless it is already present, also in another case
/// (never overwrites, like torch's register_functional_optim). Returns
/// whether it was added. A name
/// must be non-empty and `options` and `optimizer` set (dopt::ValueError).
bool register_optimizer(const std::string& name, OptimizerFactories factories);
/// Every registered name, sorted.
std::vector<std::string> registered_optimizers();

/// The spec of typed options (AdamOptions(1e-3) -> {"Adam", {"lr": 0.001,
/// ...}}): the registered optimizer whose options type is the dynamic type
/// of `options`, with every hyperparameter. Options of a type no registered
/// optimizer uses are a dopt::TypeError naming `op`.
OptimizerSpec spec_of(const OptimizerOptions& options, const char* op = "spec_of");

/// The validated options of spec. Unknown name: dopt::ValueError "unknown
/// optimizer 'X' (known: Adadelta, Adagrad, ...)"; a bad key or value:
/// dopt::ValueError/TypeError naming it. SGD without "lr" is torch's
/// ValueError "parameter group didn't specify a value of required
/// optimization parameter lr".
std::unique_ptr<OptimizerOptions> make_options(const OptimizerSpec& spec);
/// The local optimizer of spec over groups (errors as make_options, plus the
/// optimizer's own; a group whose options are of another optimizer's type is
/// a dopt::TypeError).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<OptimizerParamGroup> groups);
/// The functional form of spec over params.
std::unique_ptr<FunctionalOptimizer> make_functional(const OptimizerSpec& spec, std::vector<Tensor> params,
                                                     bool allow_empty_param_list = false);
/// torch's as_functional_optim: the functional form without params (for
/// step_param). `name_or_class` is the optimizer's name ("Adam") or its
/// functional class's ("FunctionalAdam", torch's "_FunctionalAdam"). An
/// unknown name, or one without a functional form, is dopt::ValueError
/// "Optimizer X does not have a functional counterpart!".
std::unique_ptr<FunctionalOptimizer> as_functional_optim(const std::string& name_or_class,
                                                         const Hyperparams& hyperparameters = {});

}  // namespace dopt::optim
