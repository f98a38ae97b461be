#pragma once
// What ZeroRedundancyOptimizer, PostLocalSGDOptimizer and the Reducer report
// after they recovered from a lost rank (docs/fault-tolerance.md): the
// Recovery record, passed to their on_membership_change callback or carried
// by MembershipChangedError; ShardLostError when state is gone.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt::optim {

/// What a recovery from a lost rank did.
struct ZeroRecovery {
  /// The survivors' group; the recovered object's group from now on.
  ProcessGroup group;
  /// Ranks of the old group that were lost, ascending.
  std::vector<int> lost;
  /// new_rank[r]: the new group rank of old group rank r (-1: lost).
  std::vector<int> new_rank;
  /// Where the recovered object stands after the recovery: ZeRO's
  /// step_count(), PostLocalSGDOptimizer's steps, the Reducer's iterations.
  std::int64_t step = 0;
  /// True when the loss came during step() and that step was completed with
  /// the gradients it was given (the trainer goes on with the next batch);
  /// false after recover(): no step was taken.
  bool step_completed = false;
};

/// What MembershipChangedError and ShardLostError carry: the recovery they
/// were thrown after.
class WithRecovery {
 public:
  const ZeroRecovery& recovery() const noexcept { return recovery_; }

 protected:
  explicit WithRecovery(ZeroRecovery recovery) : recovery_(std::move(recovery)) {}

 private:
  ZeroRecovery recovery_;
};

/// Thrown on every survivor after it recovered from a lost rank, where no
/// on_membership_change callback is set: by ZeroRedundancyOptimizer::step()
/// (redundancy > 0), PostLocalSGDOptimizer::step() and Reducer::finalize()
/// (survive enabled). The object is usable over recovery().group.
class MembershipChangedError : public Error, public WithRecovery {
 public:
  MembershipChangedError(std::string op, std::string what, ZeroRecovery recovery, std::optional<int> rank)
      : Error(std::move(op), std::move(what), rank), WithRecovery(std::move(recovery)) {}
};

/// Recovery found a shard whose owner and buddies were all lost: the message
/// names the ranks and parameters whose state is gone. The optimizer is
/// unusable; recovery().group is the survivors' group to fall back on.
class ShardLostError : public StateError, public WithRecovery {
 public:
  ShardLostError(std::string op, std::string what, ZeroRecovery recovery, std::optional<int> rank)
      : StateError(std::move(op), std::move(what), rank), WithRecovery(std::move(recovery)) {}
};

}  // namespace dopt::optim
