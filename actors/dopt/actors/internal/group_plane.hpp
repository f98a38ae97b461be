#pragma once
// The seam between the collective protocol and the planes that move bytes.
//
// A GroupPlane serves one rank's calls in one group. ProcessGroup numbers the
// calls (sequence numbers, in the rank's program order) and checks their
// arguments; the plane matches them with the peers' calls of the same
// number, compares what every member asked for (CollectiveMismatchError),
// moves and reduces the bytes, and bounds every wait by the call's timeout
// (TimeoutError, after which the group is unusable) and by the peers'
// liveness (PeerLostError naming the lost rank).
//
// Planes: actor (messages between rank actors; tcp between hosts),
// shm (lock-free slots in shared memory, for ranks on one host: processes
// or simulated ranks), and the device planes that other components register
// for tensors off the CPU (device_plane.hpp; gpu/'s NCCL plane for CUDA).
// See docs/architecture.md.
#include <cstdint>
#include <memory>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/internal/op.hpp"

namespace dopt::detail {

class GroupPlane;

/// A plane's part of a new group among some members of an existing one
/// (ProcessGroup::shrink), made in three steps that the caller separates
/// with barriers among the new group's members (on the rank actors, which
/// outlive a lost peer): create() this rank's own state (its shared-memory
/// region), attach() the others' (every member created its own) and make
/// the group's plane, seal() once every member attached (names go, so a
/// crash leaves nothing behind). Destroyed unsealed (a failed attempt), it
/// drops what create() made.
class GroupBuilder {
 public:
  virtual ~GroupBuilder() = default;
  virtual void create() = 0;
  virtual std::shared_ptr<GroupPlane> attach() = 0;
  virtual void seal() = 0;
};

class GroupPlane {
 public:
  virtual ~GroupPlane() = default;
  /// Runs op and returns when it is done; throws its error. Called by the
  /// rank's thread that waits for the result anyway: the plane may do the
  /// work on it.
  virtual void run(const OpPtr& op) = 0;
  /// Starts op and returns at once; the future carries its result. Its
  /// continuations run on the thread that completes it (never block there).
  virtual Future<void> run_async(const OpPtr& op) = 0;
  /// Whether this plane runs calls with this descriptor itself (otherwise
  /// ProcessGroup emulates them with calls it does run).
  virtual bool supports(const CollDesc& desc) const = 0;
  virtual const char* name() const noexcept = 0;
  /// Bytes this rank sent to other hosts through the plane.
  virtual std::uint64_t bytes_to_other_hosts() const noexcept { return 0; }
  /// Bytes this rank read from other ranks' memory on its host with
  /// cross-memory attach (the hierarchical plane).
  virtual std::uint64_t bytes_read_from_host_peers() const noexcept { return 0; }
  /// The plane of a group that a new_group call on this plane made (null:
  /// this plane makes none, or this rank is not a member).
  virtual std::shared_ptr<GroupPlane> made_group(std::uint64_t /*gid*/) const { return nullptr; }
  /// Builds this plane's part of group gid over `members` (global ranks,
  /// this rank among them, all members of this group). Null: this plane
  /// makes no such group, the new one runs on the actor plane.
  virtual std::unique_ptr<GroupBuilder> builder(std::uint64_t /*gid*/,
                                                std::shared_ptr<const std::vector<int>> /*members*/) const {
    return nullptr;
  }
  /// Rank `global_rank` runs in process `pid` from now on (the replacement
  /// of a lost rank that grow() takes in between processes): the builders
  /// this plane makes later find that rank's state under its new process.
  /// Called by grow() on the user thread before builder(); false when this
  /// plane cannot reach a replaced rank (its groups cannot grow back).
  virtual bool renew_process(int /*global_rank*/, std::int64_t /*pid*/) { return false; }
};

}  // namespace dopt::detail
