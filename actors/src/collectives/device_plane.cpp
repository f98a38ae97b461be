// The registry of device planes (dopt/actors/internal/device_plane.hpp) and
// the handles a device plane keeps of its group.
#include "dopt/actors/internal/device_plane.hpp"

#include "collectives/access.hpp"
#include "collectives/group.hpp"
#include "dopt/runtime/internal/device_registry.hpp"

namespace dopt::detail {
namespace {
DeviceRegistry<DevicePlaneFactory> g_factories;
}  // namespace

void register_device_plane(DeviceType type, DevicePlaneFactory* factory) {
  g_factories.set(type, factory, "register_device_plane", "CPU tensors always use the group's CPU plane");
}

DevicePlaneFactory* device_plane_factory(const Tensor& tensor) noexcept { return g_factories.find(tensor); }

WeakGroup::WeakGroup(const ProcessGroup& group) : impl_(Access::impl(group)) {}

ProcessGroup WeakGroup::lock() const {
  auto impl = impl_.lock();
  return impl ? Access::group(std::move(impl)) : ProcessGroup();
}

const void* group_identity(const ProcessGroup& group) noexcept { return Access::impl(group).get(); }

std::shared_ptr<GroupPlane> device_plane(const ProcessGroup& pg, GroupImpl& g, const Tensor& first, const char* op) {
  DevicePlaneFactory* factory = device_plane_factory(first);
  const Device device = first.device();
  if (!factory)
    throw DeviceError(op, "the tensors are on " + device.str() + "; no plane runs collectives on that device");
  std::lock_guard<std::mutex> lock(g.device_planes_mutex);
  auto& slot = g.device_planes[{static_cast<int>(device.type), device.index}];
  if (!slot) slot = factory->make(pg, device);
  if (!slot) throw DeviceError(op, "no plane runs collectives on " + device.str() + " for this group");
  return slot;
}

}  // namespace dopt::detail
