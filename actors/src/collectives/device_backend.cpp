#include "dopt/actors/internal/device_backend.hpp"

#include "collectives/access.hpp"
#include "dopt/runtime/internal/device_registry.hpp"

namespace dopt::detail {
namespace {
DeviceRegistry<DeviceBackend> g_backends;
}  // namespace

void register_device_backend(DeviceType type, DeviceBackend* backend) {
  g_backends.set(type, backend, "register_device_backend", "CPU tensors always use the rank actors' collectives");
}

DeviceBackend* device_backend_for(const Tensor& tensor) noexcept { return g_backends.find(tensor); }

const void* group_identity(const ProcessGroup& group) noexcept { return Access::impl(group).get(); }

}  // namespace dopt::detail
