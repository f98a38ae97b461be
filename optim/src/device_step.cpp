#include "dopt/optim/internal/device_step.hpp"

#include "dopt/runtime/internal/device_registry.hpp"

namespace dopt::optim::detail {
namespace {
dopt::detail::DeviceRegistry<DeviceStepper> g_steppers;
}  // namespace

void register_device_stepper(DeviceType type, DeviceStepper* stepper) {
  g_steppers.set(type, stepper, "register_device_stepper", "CPU parameters always use the CPU kernels");
}

DeviceStepper* device_stepper_for(const Tensor& param) noexcept { return g_steppers.find(param); }

}  // namespace dopt::optim::detail
