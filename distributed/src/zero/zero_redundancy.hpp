#pragma once
// Redundancy: how a ZeroRedundancyOptimizer keeps other ranks' shards so that
// training survives a lost rank (zero.hpp, "Redundancy"; design in
// docs/fault-tolerance-optimizers.md). One object per optimizer, chosen once at
// construction from ZeroOptions (make_redundancy): NoRedundancy (k = 0, and
// overlap_with_ddp), or a Buddies mode (zero_buddies.hpp): CopyBuddies
// (ZeroBuddyUpdate::step), ReplayBuddies (replay), HostMemoryBuddies
// (host_memory). ZeroCore calls it on the rank thread, at the points below;
// it changes ZeroCore's shared state only where a contract says so.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "dopt/distributed/zero.hpp"

namespace dopt::optim::zero_detail {

using StateByParam = std::unordered_map<const TensorImpl*, ParamState>;

class Redundancy {
 public:
  virtual ~Redundancy() = default;

  /// Constructor, before the partition (every rank alike, no collective):
  /// the mode's own checks of the parameters and options.
  virtual void check(const ZeroCore&, const ZeroOptions&) const {}

  /// Constructor, after the partition and the local optimizer exist
  /// (collective for the buddy modes): what the mode keeps, and the buckets
  /// when bucket_view.
  virtual void start(ZeroCore& z, const ZeroOptions& options) = 0;
  /// The buckets for the current partition (construction, and step() when
  /// the trainable parameters changed; collective with host memory).
  virtual void build_buckets(ZeroCore& z);
  /// step() before anything else: a closure it cannot take is a ValueError.
  virtual void check_closure(const Optimizer::LossClosure& closure, int rank) const = 0;
  /// add_param_group before anything else: NotSupportedError where refused.
  virtual void check_add_group(const std::string& op, int rank) const = 0;
  /// step(), right after the local optimizer stepped.
  virtual void after_local_step(ZeroCore& z) = 0;
  /// step() after after_local_step: the shards to every rank, `notify`
  /// (the Join context's) waited for, step_count() advanced. A lost rank
  /// is recovered from here (then the step is complete and the recovery
  /// returned); other errors propagate.
  virtual std::optional<ZeroRecovery> finish_step(ZeroCore& z, Future<void>& notify) = 0;
  /// step_async(): whether finish_step is only the broadcasts of the shards
  /// and the notify (then they may complete after step_async returns); the
  /// buddy modes keep copies and recover inside the step, so they finish it.
  virtual bool background_broadcasts() const noexcept { return false; }
  /// recover(): StateError without redundancy.
  virtual ZeroRecovery recover(ZeroCore& z) = 0;

  /// Whether this rank keeps the state of global parameter i (its owner, or a buddy keeping a copy).
  virtual bool keeps_state_of(const ZeroCore& z, std::size_t i) const = 0;
  /// The end of the loads: `local` (the state of every parameter
  /// keeps_state_of) becomes the local optimizer's and the copies'.
  virtual void install_state(ZeroCore& z, StateByParam local) = 0;

  /// The accessors of zero.hpp.
  /// Redundancy in effect in a group of `world` ranks.
  virtual int k(int world) const noexcept = 0;
  virtual std::vector<int> buddies(int r) const = 0;
  virtual std::int64_t copy_bytes() const = 0;
  virtual bool reads_parameters_from_segments() const noexcept { return false; }
};

/// k = 0 (torch's ZeRO) and overlap_with_ddp: nothing kept, nothing to recover.
class NoRedundancy final : public Redundancy {
 public:
  void start(ZeroCore& z, const ZeroOptions& options) override;
  void check_closure(const Optimizer::LossClosure&, int) const override {}
  void check_add_group(const std::string&, int) const override {}
  void after_local_step(ZeroCore&) override {}
  std::optional<ZeroRecovery> finish_step(ZeroCore& z, Future<void>& notify) override;
  bool background_broadcasts() const noexcept override { return true; }
  ZeroRecovery recover(ZeroCore& z) override;
  bool keeps_state_of(const ZeroCore& z, std::size_t i) const override;
  void install_state(ZeroCore& z, StateByParam local) override;
  int k(int) const noexcept override { return 0; }
  std::vector<int> buddies(int) const override { return {}; }
  std::int64_t copy_bytes() const override { return 0; }
};

/// The mode ZeroOptions asks for (redundancy, buddy_update; overlap_with_ddp
/// has none). The options' values were checked before.
std::unique_ptr<Redundancy> make_redundancy(const ZeroOptions& options);

}  // namespace dopt::optim::zero_detail
