#pragma once
// dopt::detail's device planes: how an optional component (gpu/, for CUDA
// tensors over NCCL) runs ProcessGroup collectives on tensors that do not
// live on the CPU, as a GroupPlane (group_plane.hpp).
//
// ProcessGroup checks a call's arguments and numbers it as on the CPU, then
// picks its plane in one place: for tensors on a device (all of the call's
// tensors on one device, else DeviceError), that device type's registered
// factory makes this rank's plane of the group for that device, on the first
// such call (so every member makes it in the same order, like a collective;
// the factory may run collectives on the group's CPU plane), and the group
// keeps it for later calls. With no factory registered for the type, a
// tensor on it is a DeviceError, as before. Calls the plane does not
// support() are refused (NotSupportedError); barrier(), new_group() and
// new_subgroups() have no tensors and always run on the CPU plane.
//
// A device plane keeps the GroupPlane contract: bad arguments are refused
// before it is called; errors (timeouts, lost peers, mismatches) arrive in
// the future; no call blocks forever. It matches calls by their order (as
// NCCL does); check_calls_match() below compares them across ranks, for the
// planes that offer it.
//
// register_device_plane is called once per device type (gpu::init()); the
// factory must live until the process exits (or until it is replaced).
#include <memory>

#include "dopt/actors/internal/group_plane.hpp"
#include "dopt/actors/internal/op.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::detail {

/// Makes one rank's planes of groups for tensors of one device type.
class DevicePlaneFactory {
 public:
  virtual ~DevicePlaneFactory() = default;
  /// This rank's plane of `group` for tensors on `device`. Called by
  /// ProcessGroup on the thread of the group's first call with such tensors,
  /// once per (group, device); every member calls it at the same point of
  /// its calls on the group. The plane must not hold `group` (the group
  /// holds the plane): keep a WeakGroup.
  virtual std::shared_ptr<GroupPlane> make(const ProcessGroup& group, Device device) = 0;
};

/// Registers (or, with nullptr, removes) the factory for tensors on `type`
/// (not CPU: ValueError).
void register_device_plane(DeviceType type, DevicePlaneFactory* factory);
/// The factory for tensor's device, or nullptr (CPU tensors, undefined
/// tensors, none registered).
DevicePlaneFactory* device_plane_factory(const Tensor& tensor) noexcept;

/// A handle on a group that does not keep it alive, for a plane that the
/// group's state holds.
class WeakGroup {
 public:
  explicit WeakGroup(const ProcessGroup& group);
  /// The group; an invalid handle once it is gone.
  ProcessGroup lock() const;

 private:
  std::weak_ptr<ProcessGroup::Impl> impl_;
};

/// Identifies this rank's handle state of `group` (the same for every copy
/// of the handle, distinct between live groups, also between simulated ranks
/// of one process): a key for a plane's per-group resources.
const void* group_identity(const ProcessGroup& group) noexcept;

/// Compares op's descriptor (and sequence number) with every member's, by an
/// all_gather over `cpu` (the group op belongs to, on its CPU plane): a
/// collective itself, so every member calls it for the same calls.
/// Throws CollectiveMismatchError naming the first rank that differs, as the
/// CPU planes do; returns when all agree. For send and recv (between two
/// ranks) it does nothing.
void check_calls_match(ProcessGroup cpu, const Op& op);

}  // namespace dopt::detail
