#pragma once
// The Redundancy modes with buddies (ZeroOptions::redundancy = k > 0): each
// rank's shard is also kept by its buddies, so that the survivors of a lost
// rank recover (contract in zero.hpp; design in docs/fault-tolerance-optimizers.md).
//   Buddies            the buddy table (from the hosts), the recovery's
//                      driver (zero_recovery.cpp), step()'s end
//   CopyBuddies        ZeroBuddyUpdate::step: an optimizer per kept shard,
//                      stepped every step (zero_buddies.cpp)
//   ReplayBuddies      ZeroBuddyUpdate::replay: the copies saved gradients
//                      and snapshots (zero_replay.cpp)
//   HostMemoryBuddies  ZeroBuddyUpdate::host_memory: the shard in shared
//                      memory its host-mates map (zero_host_memory.cpp)
// The recovery asks the mode at fixed points (the protected hooks below);
// each runs on the rank thread inside recover()/step().
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero_buckets.hpp"
#include "zero_host_memory.hpp"
#include "zero_redundancy.hpp"

namespace dopt::optim::zero_detail {

class Buddies : public Redundancy {
 public:
  explicit Buddies(int requested) : requested_(requested) {}

  /// The host map (ZeroOptions::hosts, or measured: an all_gather), the
  /// buddy table, then setup() and the buckets.
  void start(ZeroCore& z, const ZeroOptions& options) override;
  void check_closure(const Optimizer::LossClosure& closure, int rank) const override;
  void check_add_group(const std::string& op, int rank) const override;
  void after_local_step(ZeroCore&) override {}
  std::optional<ZeroRecovery> finish_step(ZeroCore& z, Future<void>& notify) override;
  ZeroRecovery recover(ZeroCore& z) override;
  int k(int world) const noexcept override;
  std::vector<int> buddies(int r) const override;

 protected:
  /// A loss seen by finish_step or recover(): the survivors' group, the new
  /// partition, every shard's state where it belongs (zero_recovery.cpp).
  ZeroRecovery recover_from_loss(ZeroCore& z, bool in_step);
  /// The shards to every rank (ShardSync; host memory may read segments).
  virtual void sync_shards(ZeroCore& z, const std::function<void()>& meanwhile);
  /// The buddy table of a group of these global ranks (from the host map).
  std::vector<std::vector<int>> table_of(const std::vector<int>& members) const;
  /// The buddy table of a group whose rank r is on hosts[r]; k capped at size - 1.
  virtual std::vector<std::vector<int>> table_for(const std::vector<std::string>& hosts, int k) const;
  /// start(): what the mode keeps for the current partition and table.
  virtual void setup(ZeroCore& z) = 0;

  // --- the recovery's points (zero_recovery.cpp says when) ---
  struct Loss {
    std::vector<int> new_rank;                 // by old group rank, -1: lost
    std::vector<int> source;                   // by old rank: the new rank that holds its shard's state
    std::vector<std::vector<int>> old_table;   // the buddy table before
    std::vector<int> old_owner;                // the owners before, by global index
    int me = 0;                                // this rank's new group rank
  };
  /// Once per recovery, before its first try.
  virtual void begin_recovery() {}
  /// Each try, before the step in flight is broadcast: bring what this rank
  /// holds of each lost shard up to date (replay, rebuild).
  virtual void lost_shards(ZeroCore&, const Loss&, bool /*in_step*/) {}
  /// Whether every survivor rebuilt lost rank o's parameters alike (no broadcast needed).
  virtual bool rebuilt_everywhere(const Loss&, int /*o*/, int /*old_world*/) const { return false; }
  /// Whether a buddy keeps a copy of the owner's state (host memory: they map it).
  virtual bool buddies_hold_copies() const { return true; }
  /// Whether new rank r held old rank o's state up to date before the loss.
  virtual bool kept_before(const Loss& loss, int o, int r) const;
  /// The state this rank can hand on, beyond the local optimizer's.
  virtual void add_available(const Loss&, StateByParam&) const {}
  /// After the new partition, before the state moves (collective where it
  /// needs one); whether it did anything.
  virtual bool prepare(ZeroCore&, ProcessGroup&, const std::vector<std::vector<int>>& /*new_table*/,
                       const std::vector<Kind>& /*kinds*/, const std::vector<std::vector<std::vector<Tensor>>>& /*moved*/,
                       const Loss&, bool /*keep_anew*/) {
    return false;
  }
  /// Where a received state tensor goes (undefined: fresh memory).
  virtual Tensor receive_buffer(std::int64_t /*index*/, const std::string& /*key*/, const Shape&, DType) const {
    return Tensor();
  }
  /// The commit: the mode's copies of the new partition, from `avail`.
  virtual void commit(ZeroCore&, const StateByParam& /*avail*/) {}
  /// The commit's buckets (after commit()).
  virtual void commit_buckets(ZeroCore& z, const Loss& loss, bool same_trainable, const std::vector<Kind>& kinds,
                              const std::vector<std::vector<std::vector<Tensor>>>& moved, bool keep_anew);
  /// A further loss during the recovery: the mode's part of the try is dropped.
  virtual void abandon_try() {}

  int requested_ = 0;                      // ZeroOptions::redundancy
  std::map<int, std::string> host_of_;     // by global rank
  std::vector<std::vector<int>> table_;    // table_[r] = buddies(r) in the current group
};

/// ZeroBuddyUpdate::step.
class CopyBuddies : public Buddies {
 public:
  using Buddies::Buddies;
  void after_local_step(ZeroCore& z) override;
  bool keeps_state_of(const ZeroCore& z, std::size_t i) const override;
  void install_state(ZeroCore& z, StateByParam local) override;
  std::int64_t copy_bytes() const override;

 protected:
  void setup(ZeroCore& z) override;
  void add_available(const Loss& loss, StateByParam& avail) const override;
  void commit(ZeroCore& z, const StateByParam& avail) override;
  /// The copies anew for the current partition and table, empty state.
  virtual void make_copies(ZeroCore& z);

  std::map<int, std::unique_ptr<Optimizer>> copies_;  // by the owner's group rank
};

/// ZeroBuddyUpdate::replay (zero_replay.cpp).
class ReplayBuddies final : public CopyBuddies {
 public:
  ReplayBuddies(int requested, int snapshot_interval) : CopyBuddies(requested), interval_(snapshot_interval) {}
  void after_local_step(ZeroCore&) override {}
  std::optional<ZeroRecovery> finish_step(ZeroCore& z, Future<void>& notify) override;
  void install_state(ZeroCore& z, StateByParam local) override;
  std::int64_t copy_bytes() const override;

 protected:
  void make_copies(ZeroCore& z) override;
  void lost_shards(ZeroCore& z, const Loss& loss, bool in_step) override;
  bool kept_before(const Loss& loss, int o, int r) const override;
  void add_available(const Loss& loss, StateByParam& avail) const override;

 private:
  /// What a buddy keeps of a shard since the snapshot its copy's state is from.
  struct Log {
    struct Saved {
      std::vector<Tensor> grads;  // by position in the shard; undefined: no gradient
      std::vector<std::unique_ptr<OptimizerOptions>> options;  // by group
    };
    std::vector<Tensor> params;  // the shard's parameters at the snapshot
    std::vector<Saved> saved;    // the steps since, in order
    std::vector<std::vector<Tensor>> spare;  // gradient buffers to reuse
    /// The next snapshot's receive buffers (the state tensors the last one
    /// replaced, in the order of its entries).
    std::vector<Tensor> incoming;
  };
  /// Every copy's snapshot is now (after the copies' state was set).
  void reset_snapshots(const ZeroCore& z);
  /// Saves this step's gradients and hyperparameters for every copy (only: that one's).
  void save_grads(const ZeroCore& z, int only = -1);
  /// The owner's side of a snapshot: posts its state to its buddies.
  std::vector<Future<void>> post_snapshot(ZeroCore& z);
  /// The buddies' side (after the broadcasts), then waits for `sends`; a
  /// snapshot a lost rank interrupts is dropped (the older one stays).
  void finish_snapshot(ZeroCore& z, std::vector<Future<void>>& sends);
  /// Replays the saved steps of the copy of `target` onto its shard's parameters.
  void replay(ZeroCore& z, int target);

  int interval_ = 4;
  std::map<int, Log> logs_;  // by target, as copies_
};

/// ZeroBuddyUpdate::host_memory (zero_host_memory.cpp).
class HostMemoryBuddies final : public Buddies {
 public:
  HostMemoryBuddies(int requested, std::int64_t chunk) : Buddies(requested), chunk_(chunk) {}
  void check(const ZeroCore& z, const ZeroOptions& options) const override;
  void build_buckets(ZeroCore& z) override;
  bool keeps_state_of(const ZeroCore& z, std::size_t i) const override;
  void install_state(ZeroCore& z, StateByParam local) override;
  std::int64_t copy_bytes() const override { return 0; }
  bool reads_parameters_from_segments() const noexcept override { return reads_direct_; }

 protected:
  std::vector<std::vector<int>> table_for(const std::vector<std::string>& hosts, int k) const override;
  void setup(ZeroCore& z) override;
  void sync_shards(ZeroCore& z, const std::function<void()>& meanwhile) override;
  void begin_recovery() override { rebuilt_by_owner_.clear(); }
  void lost_shards(ZeroCore& z, const Loss& loss, bool in_step) override;
  bool rebuilt_everywhere(const Loss& loss, int o, int old_world) const override;
  bool buddies_hold_copies() const override { return false; }
  void add_available(const Loss& loss, StateByParam& avail) const override;
  bool prepare(ZeroCore& z, ProcessGroup& ng, const std::vector<std::vector<int>>& new_table,
               const std::vector<Kind>& kinds, const std::vector<std::vector<std::vector<Tensor>>>& moved,
               const Loss& loss, bool keep_anew) override;
  Tensor receive_buffer(std::int64_t index, const std::string& key, const Shape& shape, DType dtype) const override;
  void commit_buckets(ZeroCore& z, const Loss& loss, bool same_trainable, const std::vector<Kind>& kinds,
                      const std::vector<std::vector<std::vector<Tensor>>>& moved, bool keep_anew) override;
  void abandon_try() override { share_ = KeepShare{}; }

 private:
  /// The segment of all of rank r's parameters of the current partition.
  KeepSpec full_spec(const ZeroCore& z, int r) const;
  /// A segment's layout (every rank computes the same).
  KeepPlan plan_of(const ZeroCore& z, const KeepSpec& spec);
  /// Collective over g: every rank makes a segment for fresh[its global
  /// rank] and maps the segments of the ranks it keeps in `table`.
  KeepShare share(const ZeroCore& z, ProcessGroup& g, const std::vector<std::vector<int>>& table,
                  const std::map<int, KeepSpec>& fresh, bool anew);
  /// Takes share's segments (anew: the buckets are rebuilt, this rank's in
  /// the segment); the new segment's state moves in; the journaling hook.
  void install(ZeroCore& z, KeepShare share, bool anew);
  /// Collective: one segment per rank for the current partition.
  void share_anew(ZeroCore& z);
  /// The note, once per host, that the segments have 4 KiB pages.
  void note_small_pages(const ZeroCore& z) const;
  void adopt_all(ZeroCore& z);
  void adopt_own(ZeroCore& z, HostKeep& k, std::size_t i);
  /// step_reads_: every rank on one host reads the others' parameters from their segments.
  void plan_reads(const ZeroCore& z);
  void read_params(ZeroCore& z);
  /// The state of rank o's shard rebuilt from its segment.
  StateByParam rebuild(const ZeroCore& z, int o, bool in_step);

  std::int64_t chunk_ = 65536;
  std::vector<std::shared_ptr<HostKeep>> keeps_;  // this rank's segments, oldest first
  std::map<int, std::vector<std::shared_ptr<HostKeep>>> buddy_keeps_;  // by the owner's group rank
  std::unordered_map<const TensorImpl*, std::pair<std::size_t, std::size_t>> keep_index_;  // (segment, position)
  std::map<int, std::vector<KeepSpec>> specs_;  // every rank's segments, by global rank
  std::map<std::pair<std::size_t, int>, std::vector<KeepEntry>> layouts_;  // by (group, dtype)
  bool reads_direct_ = false;
  struct Read {
    int owner = -1;
    Tensor from, to;
  };
  std::vector<Read> reads_;
  KeepShare share_;  // a recovery's new segments, until its commit
  std::map<int, StateByParam> rebuilt_by_owner_;  // a recovery's rebuilds, kept over its tries
  StateByParam rebuilt_;  // this try's, of the lost owners this rank maps
};

}  // namespace dopt::optim::zero_detail
