#pragma once
// ZeroCore: the implementation behind the ZeroRedundancyOptimizer facade
// (zero.hpp has every public contract). It holds the state the pieces share
// and runs the calls that span them; each piece has one job
// (docs/architecture.md, "ZeRO inside"):
//   ZeroParams (zero_params.hpp)        the parameters, by group and global index
//   Partition (zero_partition.hpp)      which rank owns which parameter
//   Buckets (zero_buckets.hpp)          the flat buffers of parameters_as_bucket_view
//   ShardSync (zero_shard_sync.hpp)     the shards from their owners after a step
//   StateDicts (zero_state_dicts.hpp)   state dicts and sharded checkpoints
//   Redundancy (zero_redundancy.hpp)    what is kept of other ranks' shards, and recovery
//   ZeroOverlap (zero_overlap_internal.hpp)  overlap_with_ddp's driver, through OverlapHost
// Rank thread only, except what OverlapHost lets the overlap worker do.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dopt/distributed/zero.hpp"
#include "zero_buckets.hpp"
#include "zero_overlap_internal.hpp"
#include "zero_params.hpp"
#include "zero_partition.hpp"
#include "zero_redundancy.hpp"
#include "zero_repoint.hpp"
#include "zero_state_dicts.hpp"

namespace dopt::optim {

struct ZeroCore final : zero_detail::OverlapHost {
  /// The constructor of zero.hpp (its checks, errors and collectives, in that order).
  ZeroCore(ZeroRedundancyOptimizer& self, std::vector<OptimizerParamGroup> groups, OptimizerSpec spec,
           ZeroOptions options);
  /// Stops the overlap worker before anything it uses goes.
  ~ZeroCore();

  // --- the calls of zero.hpp that span the pieces --------------------------------
  std::optional<double> step(const Optimizer::LossClosure& closure);
  /// zero.hpp's step_async: local_step(), then the broadcasts left in flight
  /// (kept in in_flight) where the mode lets them (Redundancy::background_broadcasts).
  Future<void> step_async();
  /// Waits for a step_async() in flight; StateError naming `op` when one failed
  /// (from then on). Rank thread; const for the const calls of zero.hpp that wait.
  void settle(const std::string& op) const;
  void zero_grad(bool set_to_none);
  void add_param_group(OptimizerParamGroup group);
  /// overlap: StateError unless the plan exists and no iteration is in flight.
  void require_overlap_idle(const std::string& op) const;

  // --- helpers of the pieces (rank thread) ----------------------------------------
  /// Global hyperparameters into the local optimizer, and back.
  void sync_to_local();
  void sync_from_local();
  /// The local optimizer anew over this rank's part of the partition.
  void remake_local_optimizer();
  /// Probe point (ZeroOptions::probe), when set.
  void probe_at(const char* point, int index) const {
    if (probe) probe(point, steps, index);
  }
  /// ShardSync over the current group, partition and buckets ("broadcast" probes).
  void broadcast_shards(const std::function<void()>& meanwhile = nullptr);
  /// The same broadcasts left in flight: the future completes when they and
  /// `notify` (the Join context's) have, with the first error (broadcasts first).
  Future<void> post_shards(const Future<void>& notify);
  /// step() and step_async() alike up to the broadcasts: the Join context's
  /// notify (into `notify`), the buckets when the trainable parameters
  /// changed, the probes, the local step, the redundancy's after_local_step.
  std::optional<double> local_step(const Optimizer::LossClosure& closure, Future<void>& notify);

  // --- OverlapHost -------------------------------------------------------------
  void adopt_plan(zero_detail::Partition part) override;
  Future<void> notify_join() override;
  std::vector<Hyperparams> hyperparams() const override;
  void swap_local_state(zero_detail::StateByParam& state) override;
  void count_overlapped_step() override { ++steps; }

  // --- shared state --------------------------------------------------------------
  ZeroRedundancyOptimizer& self;  // the Joinable of step()'s notify
  OptimizerSpec spec;
  ProcessGroup group;  // changes with a recovery, as do rank and world
  int rank = 0;
  int world = 1;
  bool bucket_view = false;
  ZeroPartitionWeight weight = ZeroPartitionWeight::element_count;
  ZeroBuddyUpdate buddy_update = ZeroBuddyUpdate::step;  // as asked (buddy_update())
  zero_detail::ZeroParams params;
  zero_detail::Partition part;
  std::unique_ptr<Optimizer> optim;  // over this rank's part
  zero_detail::Buckets buckets;
  std::vector<bool> trainable;  // requires_grad() by global index, as the buckets were built
  std::int64_t steps = 0;
  zero_detail::Repoint repoint;
  std::function<void(const char*, std::int64_t, int)> probe;
  std::function<void(const ZeroRecovery&)> on_membership_change;
  zero_detail::StateDicts dicts;
  std::unique_ptr<zero_detail::Redundancy> redundancy;
  std::shared_ptr<zero_detail::ZeroOverlap> overlap;  // overlap_with_ddp only
  // step_async(): its background part until settle() collected it, and, once
  // one failed, what settle() reports from then on.
  mutable Future<void> in_flight;
  mutable std::int64_t in_flight_step = 0;
  mutable std::string failed;
};

/// The facade's core, for the hook factories of zero_overlap.hpp and the
/// Checkpointer's shared_shard (zero_state_dicts.hpp).
struct ZeroCoreAccess {
  static ZeroCore& core(ZeroRedundancyOptimizer& z) { return *z.core_; }
};

}  // namespace dopt::optim
