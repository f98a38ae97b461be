#pragma once
// Internal to dopt_actors: what the user-facing ProcessGroup hands to its
// rank actor, without CAF types (only rank_actor.cpp includes CAF).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"
#include "plane/op.hpp"
#include "plane/peer_table.hpp"
#include "plane/plane.hpp"

namespace caf {
class actor_system;
class actor;
}

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

/// The runtime's actor system (StateError naming op once shut down).
caf::actor_system& runtime_system(class RuntimeImpl& rt, const char* op);
/// stop() runs in Runtime::shutdown, before CAF's threads are joined: it must
/// make the actors it stands for exit and drop their handles.
void runtime_add_stopper(class RuntimeImpl& rt, std::function<void()> stop);

/// Spawns world_size connected rank actors (in-process transport) in any
/// actor system, e.g. the deterministic one of CAF's test coordinator
/// fixture (actors/src/protocol.test.cpp). actors (if not null) receives
/// their handles. Each endpoint stops its actor when destroyed.
std::vector<std::shared_ptr<RankEndpoint>> spawn_rank_actors(caf::actor_system& sys, int world_size,
                                                              std::chrono::milliseconds timeout,
                                                              std::vector<caf::actor>* actors,
                                                              std::shared_ptr<PeerTable> table = nullptr);

/// Spawns world_size connected rank actors in rt (in-process transport),
/// sharing one PeerTable. Each endpoint stops its actor when destroyed.
struct LocalWorld {
  std::vector<std::shared_ptr<RankEndpoint>> endpoints;
  std::shared_ptr<PeerTable> table;
};
LocalWorld spawn_local_world(class RuntimeImpl& rt, int world_size);

struct GroupImpl {
  std::shared_ptr<RankEndpoint> endpoint;
  std::uint64_t gid = 0;
  std::shared_ptr<const std::vector<int>> members;
  int my_grank = -1;
  bool is_world = false;
  /// Ranks per node (LOCAL_WORLD_SIZE) for new_subgroups(0); 0: all on one node.
  int local_world_size = 0;
  std::atomic<std::int64_t> timeout_ms{0};
  std::atomic<std::uint64_t> next_seq{0};
  std::mutex p2p_mutex;
  std::map<std::pair<int, int>, std::uint64_t> send_seq;  // (dst global, tag)
  std::map<std::pair<int, int>, std::uint64_t> recv_seq;  // (src global, tag)
  /// Where the group's collectives run (null: the rank actor, through endpoint).
  std::shared_ptr<GroupPlane> plane;
  /// This process's view of every rank's liveness (shrink() reads it).
  std::shared_ptr<PeerTable> peers;
  /// A group made by shrink(): the id of the group its line started from.
  std::optional<std::uint64_t> origin;
};

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

namespace dopt {
struct LaunchEnv;
struct InitOptions;
class Runtime;
}  // namespace dopt

namespace dopt::detail {
/// distributed.hpp's init_process_group (runtime.cpp: it spawns the rank actor).
ProcessGroup init_world_group(Runtime& runtime, const LaunchEnv& env, const InitOptions& options);
}  // namespace dopt::detail
