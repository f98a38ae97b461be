#pragma once
// dopt::optim::detail::DeviceStepper: the hook through which an optional
// component (gpu/: the fused CUDA kernels) updates parameters that do not
// live on the CPU.
//
// Optimizer::step(), FunctionalOptimizer::step() and step_param() hand the
// parameters whose device has a registered stepper to it, one call per param
// group (with the group's options), after creating their lazy state as for
// CPU parameters; CPU parameters take the CPU kernels as before. Without a
// stepper for a device, its parameters reach the CPU kernels, which throw
// NotSupportedError as before. The stepper returns once the parameters and
// state are updated (the CPU path's synchronous contract), and throws the CPU
// path's errors for options, gradients or state that do not fit.
//
// register_device_stepper is called once per device type (gpu::init()); the
// stepper must live until the process exits.
#include <vector>

#include "dopt/optim/optimizer.hpp"

namespace dopt::optim::detail {

class DeviceStepper {
 public:
  virtual ~DeviceStepper() = default;
  /// params[i] <- one step with grads[i] (all defined, same device) and states[i] (not null).
  virtual void step(const OptimizerOptions& options, const std::vector<Tensor>& params,
                    const std::vector<Tensor>& grads, const std::vector<ParamState*>& states) = 0;
};

/// Registers (nullptr: removes) the stepper for parameters on `type` (not CPU).
void register_device_stepper(DeviceType type, DeviceStepper* stepper);
/// The stepper for param's device, or nullptr (CPU, undefined, none registered).
DeviceStepper* device_stepper_for(const Tensor& param) noexcept;

}  // namespace dopt::optim::detail
