#pragma once
// What ZeroRedundancyOptimizer, PostLocalSGDOptimizer and the Reducer report
// after they recovered from a lost rank (docs/fault-tolerance-optimizers.md): the
// Recovery record, passed to their on_membership_change callback or carried
// by MembershipChangedError; ShardLostError when state is gone. A member's
// zero_catch_up and post_local_sgd_catch_up report a join with the same
// record (ZeroRecovery::joined) through the callback only.
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
  /// A join (zero_catch_up, post_local_sgd_catch_up, on a member): the
  /// newcomers' global ranks, ascending; `group` is then the grown group,
  /// `lost` is empty and new_rank[r] is the grown group's rank of old group
  /// rank r. Empty after a loss.
  std::vector<int> joined = {};
};

/// The record of a join on a member, after `step` (zero_catch_up,
/// post_local_sgd_catch_up): grown's group, new_rank and joined.
inline ZeroRecovery join_record(const GrowResult& grown, std::int64_t step) {
  ZeroRecovery rec;
  rec.group = grown.group;
  rec.new_rank = grown.new_rank;
  rec.joined = grown.joined;
  rec.step = step;
  return rec;
}

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
