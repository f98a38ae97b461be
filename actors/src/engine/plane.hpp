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
// or simulated ranks). See docs/architecture.md.
#include <cstdint>
#include <memory>

#include "dopt/actors/future.hpp"
#include "engine/op.hpp"

namespace dopt::detail {

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
  /// The plane of a group that a new_group call on this plane made (null:
  /// this plane makes none, or this rank is not a member).
  virtual std::shared_ptr<GroupPlane> made_group(std::uint64_t /*gid*/) const { return nullptr; }
};

}  // namespace dopt::detail
