#include "dopt/actors/device_backend.hpp"

#include <array>
#include <atomic>

namespace dopt::detail {
namespace {
std::array<std::atomic<DeviceBackend*>, 2> g_backends{};
}  // namespace

void register_device_backend(DeviceType type, DeviceBackend* backend) {
  if (type == DeviceType::CPU)
    throw ValueError("register_device_backend", "CPU tensors always use the rank actors' collectives");
  g_backends.at(static_cast<std::size_t>(type)).store(backend);
}

DeviceBackend* device_backend_for(const Tensor& tensor) noexcept {
  if (!tensor.defined()) return nullptr;
  const auto type = static_cast<std::size_t>(tensor.device().type);
  if (type == 0 || type >= g_backends.size()) return nullptr;
  return g_backends[type].load();
}

}  // namespace dopt::detail
