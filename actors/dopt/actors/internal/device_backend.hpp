#pragma once
// dopt::detail::DeviceBackend: the hook through which an optional component
// (gpu/, for CUDA tensors over NCCL) runs ProcessGroup collectives on tensors
// that do not live on the CPU.
//
// ProcessGroup's collectives look at the device of the call's first tensor
// (tensor / input / output): when it is not CPU and a backend is registered
// for that device type, the whole call goes to the backend (which checks the
// other tensors); with none registered, the call throws DeviceError as
// before. barrier(), new_group() and new_subgroups() always run on the CPU
// rank actors. The backend keeps the ProcessGroup contract: every rank of the
// group makes the same calls in the same order, bad arguments throw
// synchronously, collective errors (timeouts, lost peers) arrive in the
// returned future, and no call blocks forever.
//
// register_device_backend is called once per device type (gpu::init());
// the backend object must live until the process exits.
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::detail {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual Future<void> broadcast(ProcessGroup& group, const Tensor& tensor, int src) = 0;
  virtual Future<void> all_reduce(ProcessGroup& group, const Tensor& tensor, ReduceOp op) = 0;
  virtual Future<void> reduce(ProcessGroup& group, const Tensor& tensor, int dst, ReduceOp op) = 0;
  virtual Future<void> all_gather(ProcessGroup& group, const std::vector<Tensor>& outputs, const Tensor& input) = 0;
  virtual Future<void> all_gather_into_tensor(ProcessGroup& group, const Tensor& output, const Tensor& input) = 0;
  virtual Future<void> reduce_scatter(ProcessGroup& group, const Tensor& output, const std::vector<Tensor>& inputs,
                                      ReduceOp op) = 0;
  virtual Future<void> send(ProcessGroup& group, const Tensor& tensor, int dst, int tag) = 0;
  virtual Future<void> recv(ProcessGroup& group, const Tensor& tensor, int src, int tag) = 0;
};

/// Registers (or, with nullptr, removes) the backend for tensors on `type` (not CPU).
void register_device_backend(DeviceType type, DeviceBackend* backend);
/// The backend for tensor's device, or nullptr (CPU tensors, undefined tensors, none registered).
DeviceBackend* device_backend_for(const Tensor& tensor) noexcept;
/// Identifies this rank's handle state of `group` (the same for every copy
/// of the handle, distinct between live groups, also between simulated ranks
/// of one process): a key for a backend's per-group resources.
const void* group_identity(const ProcessGroup& group) noexcept;

}  // namespace dopt::detail
