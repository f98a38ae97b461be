#include "dopt/optim/device_step.hpp"

#include <array>
#include <atomic>

namespace dopt::optim::detail {
namespace {
std::array<std::atomic<DeviceStepper*>, 2> g_steppers{};
}  // namespace

void register_device_stepper(DeviceType type, DeviceStepper* stepper) {
  if (type == DeviceType::CPU)
    throw ValueError("register_device_stepper", "CPU parameters always use the CPU kernels");
  g_steppers.at(static_cast<std::size_t>(type)).store(stepper);
}

DeviceStepper* device_stepper_for(const Tensor& param) noexcept {
  if (!param.defined()) return nullptr;
  const auto type = static_cast<std::size_t>(param.device().type);
  if (type == 0 || type >= g_steppers.size()) return nullptr;
  return g_steppers[type].load();
}

}  // namespace dopt::optim::detail
