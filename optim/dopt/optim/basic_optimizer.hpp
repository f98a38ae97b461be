#pragma once
// The part every per-parameter optimizer (Adam, SGD, ...) shares: its two
// constructors and the hooks that hand one parameter to its static
// init_param_state / update_param (which the functional forms share too).
#include <string>
#include <utility>
#include <vector>

#include "dopt/optim/optimizer.hpp"

/// The members every optimizer on BasicOptimizer declares alike: kName
/// ("Name", torch's class name), the two constructors, and the two static
/// functions its source defines, which its functional form shares:
///   init_param_state(o, p, st): the state of parameter p (made at its first
///     step with a gradient unless the class says otherwise);
///   update_param(o, p, g, st): one step of p with gradient g (which matches
///     p); a state lacking an entry or not matching p is a dopt::StateError
///     and changes nothing.
#define DOPT_OPTIMIZER(Name, OptionsT)                                                        \
 public:                                                                                      \
  static constexpr const char* kName = #Name;                                                 \
  using ::dopt::optim::BasicOptimizer<Name, OptionsT>::BasicOptimizer;                        \
  static void init_param_state(const OptionsT& o, const Tensor& p, ParamState& st);           \
  static void update_param(const OptionsT& o, const Tensor& p, const Tensor& g, ParamState& st)

namespace dopt::optim {

/// The static per-parameter functions of optimizer class Opt (see
/// DOPT_OPTIMIZER), called with its options as the OptimizerOptions base:
/// what the virtual hooks of BasicOptimizer and BasicFunctional run.
template <class Opt>
struct OptimizerStatics {
  using Options = typename Opt::Options;
  static void init(const OptimizerOptions& o, const Tensor& p, ParamState& st) {
    Opt::init_param_state(static_cast<const Options&>(o), p, st);
  }
  static void update(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
    Opt::update_param(static_cast<const Options&>(o), p, g, st);
  }
  /// Opt::kDeviceKernels where Opt declares it (false: CPU only), else true.
  static constexpr bool device_kernels() {
    if constexpr (requires { Opt::kDeviceKernels; }) return Opt::kDeviceKernels;
    else return true;
  }
};

/// Derived provides (DOPT_OPTIMIZER declares them)
///   static constexpr const char* kName;   // torch's class name, e.g. "Adam"
///   static void init_param_state(const OptionsT&, const Tensor& p, ParamState& st);
///   static void update_param(const OptionsT&, const Tensor& p, const Tensor& g, ParamState& st);
/// and optionally `static constexpr bool kDeviceKernels = false` (CPU only).
/// The constructors check and add the groups (torch's order of checks); a
/// Derived that must see each group as it is added (eager state) uses the
/// DeferGroups constructor and calls init_groups itself.
template <class Derived, class OptionsT>
class BasicOptimizer : public Optimizer {
 public:
  using Options = OptionsT;

  explicit BasicOptimizer(std::vector<OptimizerParamGroup> groups, OptionsT defaults = OptionsT())
      : Optimizer(Derived::kName, {}, std::make_unique<OptionsT>(std::move(defaults))) {
    init_groups(std::move(groups));
  }
  /// One group of `params`; an empty list throws dopt::ValueError (as torch).
  explicit BasicOptimizer(std::vector<Tensor> params, OptionsT defaults = OptionsT())
      : BasicOptimizer(single_group(std::move(params), Derived::kName), std::move(defaults)) {}

 protected:
  struct DeferGroups {};
  BasicOptimizer(DeferGroups, OptionsT defaults)
      : Optimizer(Derived::kName, {}, std::make_unique<OptionsT>(std::move(defaults))) {}

  void init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const override {
    OptimizerStatics<Derived>::init(o, p, st);
  }
  void update(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const override {
    OptimizerStatics<Derived>::update(o, p, g, st);
  }
  bool has_device_kernels() const noexcept override { return OptimizerStatics<Derived>::device_kernels(); }
};

}  // namespace dopt::optim
