#pragma once
// dopt::Checkpointer: training checkpoints of a data-parallel job, saved and
// restored by every rank together (docs/checkpointing.md has the guide, the
// folder layout and the resharding rules).
//
//   dopt::Checkpointer ckpt(dopt::CheckpointerOptions{ctx.world(), "ckpt", 3});
//   ckpt.add_tensors("model", named_params, dopt::Placement::replicated);
//   ckpt.add_optimizer("optim", zero);
//   const auto resumed = ckpt.load_latest();   // the step, or nullopt
//   ... every K steps: ckpt.save_async(step);
//
// What it holds: items registered by name (add_*): named tensors, one of
// dopt's optimizers, a random generator, a data loader's position, user
// extras. Each registered object is referenced, not copied: it must outlive
// the Checkpointer, and save reads it, load writes it.
//
// Who calls what. The constructor, check_dir, save, save_async, load,
// load_latest and load_from are collectives of CheckpointerOptions::group:
// every rank of it calls them in the same order, from the thread that
// issues its other collectives, with the same step and the same items
// registered (same names, kinds and placements, in the same order; a save
// where they differ fails on every rank). add_*, wait, wait_snapshot and the
// accessors are local. Not thread-safe: one thread per rank calls it. A load
// checks and then applies the items in the order they were added.
//
// Collectives it runs. On the caller's thread: a DiLoCo averager's
// save_sharded (a barrier of its group) inside save/save_async, and its own
// agreements (an all_gather of a small record per rank) on the
// commit group at construction, at the start of a save, in check_dir and
// in the loads. On the background writer thread: the two agreements of a
// save's commit, on the commit group only, never on `group`, so they do not
// interleave with the user's collectives; then, on rank 0, on_commit. The commit group is
// CheckpointerOptions::commit_group or, left invalid, one the constructor
// makes with group.new_group(group.ranks()).
//
// Asynchronous saves. save_async(step) first waits for the save still in
// flight (if any; when that save failed, it throws its error instead, see
// Errors), then snapshots every item into CPU memory (tensors and optimizer
// state are copied), and returns; the files are written by a background
// thread, after which the ranks commit it (rank 0 writes checkpoint.json and
// renames step-XXXXXXXX.tmp to step-XXXXXXXX, then removes checkpoints beyond
// keep_last). Its future completes on every rank once the checkpoint is
// committed (or failed). A ZeroRedundancyOptimizer's shard is snapshotted too
// (shard_state_dict). The exception: a DiLoCo averager's replicated state,
// whose public API has no in-memory snapshot, is written on the caller's
// thread before save_async returns (save_sharded). save(step) is
// save_async(step) then wait().
//
// Where the snapshot's copies are made (CheckpointerOptions::
// background_snapshot). By default on the caller's thread, before save_async
// returns: the caller may change the registered objects as soon as it
// returns. With background_snapshot, save_async returns once the items are
// referenced (numbers and strings copied; tensors on a device copied on the
// caller's thread), and the writer thread copies the CPU tensors (parameters,
// optimizer state, ZeRO's shard) before it writes. Until wait_snapshot()
// returns, the parameters and optimizer state must not change. dopt's own
// writers wait for the copies by themselves: every optimizer's step(),
// ZeroRedundancyOptimizer's step()/step_async(), the averagers (post-local
// SGD, DiLoCo) and the Checkpointer's own calls (save, save_async, wait, the
// loads, the destructor). The caller may read the tensors (a forward pass)
// and write gradients at once; it calls wait_snapshot() before its own writes
// to parameters or state (a manual update, an optimizer's load_state_dict).
// Either way, what is saved is the state at the call.
//
// Errors (dopt::Error subclasses naming the call, "Checkpointer::save",
// "Checkpointer::load", ..., this rank, and the file): ValueError for bad
// arguments (an empty or duplicate name, a negative step); IOError for a
// file that cannot be written or read, a folder that is not a complete
// checkpoint, and a checkpoint whose files are not its own (a file of
// another checkpoint, a file of another rank: the odd file is named);
// StateDictError when the checkpoint does not fit the registered items (an
// item missing, a tensor of another shape, per-rank state at another world
// size). A load that fails on one rank fails on every rank (the others name
// it). What the group's collectives raise (PeerLostError, TimeoutError)
// passes through. A save's error (its snapshot, in the background or not,
// its write, its commit) fails it on every rank and is its future's; wait()
// rethrows it, and the next save_async or save throws it (saving nothing)
// when wait() has not, even when the future was read, so that a failed
// save is never passed over; the loads and the destructor drop it.
//
// Not covered: DistributedOptimizer (its optimizer state lives on the
// parameter owners, and its public API has no state dict or save call).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt {

class DistributedSampler;
namespace optim {
class Optimizer;
class ZeroRedundancyOptimizer;
class ShardedUnits;
class PostLocalSGDOptimizer;
}  // namespace optim

/// How an item is held across the ranks.
enum class Placement {
  /// The same on every rank (replicated parameters, a DDP optimizer): rank 0
  /// writes it once; every rank loads that copy, at any world size.
  replicated,
  /// Each rank's own (post-local SGD's parameters, a per-rank generator):
  /// every rank writes its own; it loads only at the world size it was saved
  /// at, rank r reading rank r's (StateDictError at another world size).
  per_rank,
};

/// What a committed save did, as rank 0 saw it (CheckpointerOptions::on_commit).
struct CheckpointCommit {
  std::int64_t step = 0;
  /// The checkpoint's folder (dir/step-XXXXXXXX).
  std::string folder;
  /// The folders keep_last removed.
  std::vector<std::string> removed;
  /// The folders keep_last kept although they are named like checkpoints,
  /// a line each saying why ("D/step-00000005 holds step 40 (its
  /// checkpoint.json), not the step its name says", "cannot read ..."):
  /// neither removed nor counted.
  std::vector<std::string> kept;
};

struct CheckpointerOptions {
  /// The ranks that save and load together (required).
  ProcessGroup group;
  /// The folder of the checkpoints, one step-XXXXXXXX folder each (created
  /// by the first save; required).
  std::string dir;
  /// After each save, keep only the newest keep_last complete checkpoints
  /// (and remove leftover step-*.tmp folders older than the newest). 0: all.
  int keep_last = 0;
  /// The group the commits run on: the ranks of `group` in the same order,
  /// used by nothing else. Invalid: the constructor makes one with
  /// group.new_group(group.ranks()), which needs `group` to be the world
  /// group (ValueError otherwise).
  ProcessGroup commit_group = {};
  /// The run id written into every file (letters, digits, '-', '_'). Empty:
  /// 16 hex digits drawn by rank 0 at construction. A load takes the
  /// checkpoint's, so a resumed run keeps the id of the run it resumes.
  std::string run = {};
  /// Testing aid: called on the writer thread with the path of each file
  /// just before it writes it.
  std::function<void(const std::string& path)> before_write = {};
  /// Called on rank 0's writer thread once a save is committed (renamed,
  /// keep_last applied), so that a trainer can report it; the caller's
  /// thread runs on meanwhile, so it must only hand the report over (a
  /// queue under a mutex). When set, the kept lines go only to it (else to
  /// dopt::notice_once). What it throws is the save's error on every rank
  /// (the checkpoint stays committed).
  std::function<void(const CheckpointCommit& commit)> on_commit = {};
  /// Copy the snapshot's CPU tensors on the writer thread, not the caller's
  /// (see the header): save_async returns sooner; dopt's optimizers and
  /// averagers wait for the copies by themselves, the caller's own writes
  /// to parameters or state call wait_snapshot() first.
  bool background_snapshot = false;
};

/// What a load accepts in named tensors (add_tensors), beyond their shapes
/// and dtypes.
enum class TensorValues {
  any,
  /// Finite floating-point values only: a NaN or an infinity is refused
  /// (StateDictError "FILE: tensor 'NAME/KEY' holds NaN at element 3 of
  /// 4096 ..."), for parameters that training never leaves non-finite, so
  /// that such a file is damaged or planted.
  finite,
};

/// Checks the extras a load found (add_extras), before anything is loaded;
/// `folder` is the checkpoint's. Called on every rank in the load's first
/// half, on the caller's thread: to refuse the checkpoint it throws (a
/// dopt::Error subclass: ValueError for "another run"), and the load fails
/// on every rank with nothing loaded.
using ExtrasCheck = std::function<void(const std::map<std::string, std::string>& saved, const std::string& folder)>;

class Checkpointer {
 public:
  /// Collective (see the header): makes the commit group when none is given
  /// and agrees on the run id. ValueError for an invalid group, an empty dir,
  /// keep_last < 0, a commit_group over other ranks, a bad run id.
  explicit Checkpointer(CheckpointerOptions options);
  /// Waits for the save in flight (its error, if any, is dropped: call wait()
  /// first to see it).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // --- what is saved (local; names: letters, digits, '-', '_', '.', unique) ---
  /// Named tensors (parameters, buffers), on any device; load copies into
  /// them (same shapes and dtypes; with TensorValues::finite, finite values).
  void add_tensors(const std::string& name, std::map<std::string, Tensor> tensors, Placement placement,
                   TensorValues values = TensorValues::any);
  /// A local optimizer (state_dict / load_state_dict): replicated for data
  /// parallelism with averaged gradients, per_rank otherwise.
  void add_optimizer(const std::string& name, optim::Optimizer& optimizer, Placement placement);
  /// ZeRO: each rank's shard (shard_state_dict, written in the background, the
  /// file save_sharded would write); loads at
  /// any world size (load_sharded reshards).
  void add_optimizer(const std::string& name, optim::ZeroRedundancyOptimizer& optimizer);
  /// ZeRO stage 3: each rank's shards of the parameters and of the optimizer
  /// state (the file ShardedUnits::save_sharded would write; the parameters
  /// live only there, so they need no add_tensors); loads at any world size
  /// (load_sharded reshards). Gathered units are released by a load.
  void add_optimizer(const std::string& name, optim::ShardedUnits& units);
  /// Post-local SGD: its state dict, per rank. With a DiLoCoAverager as its
  /// averager, the averager is switched to sharded checkpoints
  /// (set_sharded_checkpoints(true)): its replicated state goes to its own
  /// shards (save_sharded, on the caller's thread), its per-rank part to the
  /// state dict.
  void add_optimizer(const std::string& name, optim::PostLocalSGDOptimizer& optimizer);
  /// A generator's full state.
  void add_rng(const std::string& name, std::mt19937_64& rng, Placement placement);
  /// A counter-based generator: its seed and counter.
  void add_rng(const std::string& name, std::uint64_t& seed, std::uint64_t& counter, Placement placement);
  /// A data loader's position, replicated: the sampler's epoch and `offset`,
  /// the samples each rank has taken of that epoch's indices(). At another
  /// world size the offset is rescaled so that as many samples are taken
  /// over all ranks (StateDictError when that does not divide); load sets
  /// the sampler's epoch and the offset.
  void add_data_position(const std::string& name, DistributedSampler& sampler, std::int64_t& offset);
  /// Free-form strings (a config, a metric); load replaces the map. With a
  /// check, a load first hands it what it found (see ExtrasCheck): items are
  /// checked in the order they were added, so an extras item added first is
  /// checked before any other item is (a run's settings before its tensors'
  /// shapes).
  void add_extras(const std::string& name, std::map<std::string, std::string>& extras, Placement placement,
                  ExtrasCheck check = {});

  // --- saving and loading (collectives) ---------------------------------------
  /// Checks that dir can take checkpoints, before the first save: every rank
  /// creates it (and its parents) and writes, syncs and removes a small
  /// probe file in it. IOError on every rank when any rank cannot: its own
  /// reason ("cannot create a file in D: Permission denied", "D exists but
  /// is not a folder"), or "rank 1 failed: ..." on the others.
  void check_dir();
  /// save_async(step).get().
  void save(std::int64_t step);
  /// Snapshots and returns; the write and the commit run in the background
  /// (see the header). The future carries the save's error.
  Future<void> save_async(std::int64_t step);
  /// Local: waits for the save in flight, if any (its commit on every
  /// rank); rethrows its error.
  void wait();
  /// Local: returns once the save in flight no longer reads the registered
  /// objects (at once without background_snapshot, or with none in flight);
  /// the caller may then change them. Throws nothing: the snapshot's error
  /// is the save's.
  void wait_snapshot();
  /// Loads dir/step-XXXXXXXX into the registered items (see the header for
  /// what is checked). The run id becomes the checkpoint's.
  void load(std::int64_t step);
  /// Loads the complete checkpoint of the highest step and returns its step;
  /// nullopt when there is none (no folder yet, or only incomplete ones: a
  /// step-*.tmp, or a folder without its checkpoint.json). IOError when a
  /// folder's name disagrees with the step its checkpoint.json holds, or that
  /// file cannot be read.
  std::optional<std::int64_t> load_latest();
  /// Loads the checkpoint in `folder`, a checkpoint folder anywhere (one
  /// named step-XXXXXXXX must hold that step), and returns its step;
  /// otherwise as load(). Saves still go to dir.
  std::int64_t load_from(const std::string& folder);

  const std::string& dir() const noexcept;
  /// The folder save(step) commits and load(step) reads: dir/step-XXXXXXXX.
  std::string folder(std::int64_t step) const;
  /// The run id written into the next save.
  const std::string& run() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dopt
