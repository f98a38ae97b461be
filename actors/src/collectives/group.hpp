#pragma once
// Internal to dopt_actors: a group's state behind ProcessGroup, and what the
// user-facing ProcessGroup hands to its rank actor (RankEndpoint), without
// CAF types (only the rank actor's sources include CAF).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/access.hpp"
#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"
#include "dopt/actors/internal/op.hpp"
#include "plane/peer_table.hpp"
#include "dopt/actors/internal/group_plane.hpp"

namespace dopt::detail {

/// A rank's endpoint: how user threads reach their rank actor.
class RankEndpoint {
 public:
  virtual ~RankEndpoint() = default;
  /// Hands op to the rank actor (non-blocking). The actor fills op->promise.
  virtual void post(std::shared_ptr<Op> op) = 0;
  /// Tells the rank actor that this rank's user code failed (what = reason);
  /// the actor tells its peers, whose waits on this rank fail with PeerLostError.
  virtual void report_failure(std::string what) = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
};

}  // namespace dopt::detail

namespace dopt {

/// A group's state (detail::GroupImpl in the library's sources).
struct ProcessGroup::Impl {
  std::shared_ptr<detail::RankEndpoint> endpoint;
  std::uint64_t gid = 0;
  std::shared_ptr<const std::vector<int>> members;
  int my_grank = -1;
  bool is_world = false;
  /// Ranks per node (LOCAL_WORLD_SIZE) for new_subgroups(0); 0: all on one node.
  int local_world_size = 0;
  std::atomic<std::int64_t> timeout_ms{0};
  /// Sequence numbers of the calls on CPU tensors, and apart from them of
  /// those on device tensors: the CPU planes run their calls in sequence
  /// order, so no number of theirs may go to a device plane.
  std::atomic<std::uint64_t> next_seq{0};
  std::atomic<std::uint64_t> next_device_seq{0};
  std::mutex p2p_mutex;
  /// send/recv numbers per (peer global rank, tag, on a device).
  std::map<std::tuple<int, int, bool>, std::uint64_t> send_seq;
  std::map<std::tuple<int, int, bool>, std::uint64_t> recv_seq;
  /// Where the group's collectives on CPU tensors run (null: the rank actor, through endpoint).
  std::shared_ptr<detail::GroupPlane> plane;
  /// The planes of its collectives on device tensors, by (device type, index),
  /// made on first use (device_plane()).
  std::mutex device_planes_mutex;
  std::map<std::pair<int, int>, std::shared_ptr<detail::GroupPlane>> device_planes;
  /// This process's view of every rank's liveness (shrink() reads it).
  std::shared_ptr<detail::PeerTable> peers;
  /// A group made by shrink(): the id of the group its line started from.
  std::optional<std::uint64_t> origin;
};

}  // namespace dopt

namespace dopt::detail {

/// This rank's plane of g for tensors on first's device (first is the
/// call's first tensor, not on the CPU): made by the device type's factory on
/// the first call (device_plane.hpp), kept in g. DeviceError naming `op` when
/// no factory is registered for the device type.
std::shared_ptr<GroupPlane> device_plane(const ProcessGroup& pg, GroupImpl& g, const Tensor& first, const char* op);

/// An all_reduce of one tensor with the coalesced call's options (order,
/// pre-division), on any plane.
Future<void> all_reduce_with(ProcessGroup& pg, const Tensor& t, const AllReduceCoalescedOptions& options,
                             bool blocking);

/// ProcessGroup's coalesced calls on a plane that does not run them: one
/// flat copy of the tensors, one collective, the results copied back.
Future<void> emulate_all_reduce_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors,
                                          const AllReduceCoalescedOptions& options, bool blocking);
Future<void> emulate_broadcast_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int src,
                                         bool blocking);

}  // namespace dopt::detail
