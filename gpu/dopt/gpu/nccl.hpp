#pragma once
// The NCCL process-group backend: collectives on CUDA tensors.
//
// An NcclProcessGroup is one rank's NCCL communicator for the members of a
// CPU ProcessGroup, on one CUDA device. Two ways to use it:
//  * Implicitly: after gpu::init(), ProcessGroup checks and numbers its
//    collectives on CUDA tensors as on the CPU and runs them on the group's
//    NCCL plane (a GroupPlane over this class, gpu/src/nccl_plane.cpp; the
//    seam: docs/architecture.md). The first CUDA collective on a group
//    creates that group's communicator on the tensor's device
//    (nccl_group_for over the group), so it is, like every collective,
//    called by every member in the same order. Code written for
//    ProcessGroup (ZeRO, post-local SGD, the reducer, model averagers) then
//    runs on CUDA tensors unchanged.
//  * Explicitly: make_nccl_group(cpu_group, device), then its methods.
//
// Contract (the ProcessGroup's, with these differences):
//  * Every member calls the same collectives in the same order; NCCL does not
//    compare the calls, so a mismatch is not detected (it hangs until the
//    timeout, then fails as below). On the implicit path,
//    DOPT_NCCL_CHECK_CALLS=1 compares them first over the CPU group
//    (CollectiveMismatchError; one CPU all_gather per call; docs/gpu.md). send/recv tags are not sent: sends and
//    receives between two ranks match in the order they are issued.
//  * Streams: each communicator has its own stream (stream(); torch keeps one
//    NCCL stream per group and device), so collectives of two groups used
//    from two threads never queue behind each other. Before a collective,
//    that stream waits (on the device; the host does not block) for
//    everything the calling thread has enqueued so far on its
//    current_stream(device) (dopt/gpu/stream.hpp): produce the inputs there
//    (or under a StreamGuard of the stream that produces them) and the
//    collective reads them after the producer. The call returns at once and
//    the future is filled by the gpu completion thread when the collective
//    has finished on the device. Tensors must be untouched elsewhere until
//    the future is ready (their storages are held until then, also when a
//    tensor is re-pointed with set_data meanwhile). Nothing blocks an actor
//    thread; the calling thread may wait briefly while NCCL enqueues
//    (nonblocking mode), bounded by the timeout.
//  * The communicator runs in NCCL's nonblocking mode. Each collective is
//    bounded by the CPU group's timeout(), counted from the moment this
//    communicator's earlier collectives are done (time queued behind them
//    does not count; waiting for the inputs' producer and for the peers
//    does): when it passes, or NCCL reports an
//    asynchronous error, the communicator is aborted (ncclCommAbort), the
//    future fails (TimeoutError; PeerLostError for ncclRemoteError; DeviceError
//    for CUDA errors; ...), and every later call on this group fails at once
//    with StateError naming the first failure, like an aborted NCCL
//    communicator in torch. Nothing hangs.
//  * Reductions follow NCCL's algorithms, so float results are not bitwise
//    the CPU backend's rank-order reductions (and may differ run to run when
//    NCCL picks other algorithms). avg is ncclAvg (floating point only).
//  * Subgroups: split() makes a subgroup's communicator with ncclCommSplit
//    (every member of this group calls it; non-members of the subgroup get
//    nullptr). It is then used for the subgroup's CUDA collectives.
//
// Tensors: CUDA tensors on this group's device, float32, float64, float16,
// bfloat16, int32, int64, int8, uint8 (bool only for broadcast/all_gather/
// send/recv); shapes as the CPU ProcessGroup checks them. Bad arguments
// throw synchronously (before anything is enqueued).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/gpu/stream.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::gpu {

class NcclProcessGroup {
 public:
  ~NcclProcessGroup();
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  int device() const noexcept;
  /// The CPU group this communicator spans (its timeout bounds every wait).
  const ProcessGroup& cpu_group() const noexcept;
  /// This communicator's own stream, on which its NCCL work is enqueued.
  Stream& stream() const noexcept;

  // As ProcessGroup: op_async() enqueues the collective on stream() and
  // returns its completion future; op() does the same and waits for it.
  Future<void> broadcast_async(const Tensor& tensor, int src);
  Future<void> all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  Future<void> reduce_async(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::sum);
  Future<void> all_gather_async(const std::vector<Tensor>& outputs, const Tensor& input);
  Future<void> all_gather_into_tensor_async(const Tensor& output, const Tensor& input);
  Future<void> reduce_scatter_async(const Tensor& output, const std::vector<Tensor>& inputs,
                                    ReduceOp op = ReduceOp::sum);
  Future<void> send_async(const Tensor& tensor, int dst);
  Future<void> recv_async(const Tensor& tensor, int src);
  /// A one-element all_reduce on the device: ready once every member's earlier work is enqueued and done.
  Future<void> barrier_async();

  void broadcast(const Tensor& tensor, int src) { broadcast_async(tensor, src).get(); }
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) { all_reduce_async(tensor, op).get(); }
  void reduce(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::sum) { reduce_async(tensor, dst, op).get(); }
  void all_gather(const std::vector<Tensor>& outputs, const Tensor& input) { all_gather_async(outputs, input).get(); }
  void all_gather_into_tensor(const Tensor& output, const Tensor& input) {
    all_gather_into_tensor_async(output, input).get();
  }
  void reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(output, inputs, op).get();
  }
  void send(const Tensor& tensor, int dst) { send_async(tensor, dst).get(); }
  void recv(const Tensor& tensor, int src) { recv_async(tensor, src).get(); }
  void barrier() { barrier_async().get(); }

  /// The subgroup's communicator by ncclCommSplit. Every member of this group
  /// calls it with its handle of the same `subgroup` (made by new_group /
  /// new_subgroups on the same world); nullptr for ranks outside it.
  std::shared_ptr<NcclProcessGroup> split(const ProcessGroup& subgroup);

  /// Aborts the communicator (later calls fail with StateError). Idempotent.
  void abort(const std::string& why = "aborted by the user");
  bool aborted() const;

  struct Impl;
  explicit NcclProcessGroup(std::shared_ptr<Impl> impl);

 private:
  std::shared_ptr<Impl> impl_;
};

/// Creates this rank's communicator for cpu_group's members on `device` (-1:
/// the launcher's local rank, LOCAL_RANK or the like, when the process was
/// started by a launcher, else the calling thread's current CUDA device;
/// ValueError when the local rank names no visible device). A collective over cpu_group:
/// every member calls it, in the same order as its other collectives. Group
/// rank 0 makes the ncclUniqueId and broadcasts it over cpu_group; the
/// communicator is initialised in nonblocking mode and the call returns once
/// it is ready, or throws (TimeoutError after cpu_group.timeout(), or the NCCL
/// error) with the communicator aborted.
std::shared_ptr<NcclProcessGroup> make_nccl_group(ProcessGroup cpu_group, int device = -1);

/// The communicator the implicit backend uses for (group, this rank, device),
/// creating it (collectively, as make_nccl_group) on first use.
std::shared_ptr<NcclProcessGroup> nccl_group_for(const ProcessGroup& group, int device);

/// NCCL's version code (e.g. 22809), 0 when the library cannot be asked.
int nccl_version() noexcept;

}  // namespace dopt::gpu
