#pragma once
// What is dopt-train's own in its checkpoints (docs/dopt-train.md,
// "Checkpoints"). dopt::Checkpointer (dopt/distributed/checkpointer.hpp)
// writes, commits, prunes, verifies and loads them; dopt-train adds:
//   * the run settings that must match on resume (RunInfo), saved as the
//     Checkpointer's extras item "run", replicated, and checked by
//     check_compatible when a load finds them, before any other item;
//   * the lines a committed save prints (CommitLog: rank 0's writer thread
//     hands them to the training loop);
//   * the refusal of checkpoints of a dopt-train before the Checkpointer
//     (their checkpoint.json says "format": "dopt-train-checkpoint/N"),
//     which it does not read.
// The model and the optimizer state are registered by the strategy
// (Strategy::add_to); the data order is a pure function of (seed, step,
// rank), so the step is the data position.
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dopt/distributed/checkpointer.hpp"
#include "model.hpp"

namespace dopt_train {

/// Everything that must match between a checkpoint and the run resuming it.
struct RunInfo {
  std::string optim, inner;
  int ranks = 0;
  std::uint64_t seed = 0;
  int hidden = 0, layers = 0, batch = 0;
  DataSpec data;
  double lr = 0;
  std::int64_t plsgd_warmup = 0, plsgd_period = 0;
  int plsgd_local_group = 0;
  std::int64_t diloco_sync_every = 0, diloco_delay = 0;
  int diloco_fragments = 0;
  double diloco_alpha = 0, diloco_outer_lr = 0, diloco_outer_momentum = 0;
  std::string diloco_wire;
  bool diloco_error_feedback = false;
  /// --elastic: a checkpoint written by another number of ranks is resumed
  /// too (not saved: it is this run's choice, not the checkpoint's).
  bool any_ranks = false;
  /// The settings as the checkpoint's extras: key (the flag without "--",
  /// '_' for '-') -> its value as JSON ("\"zero\"", "3", "0.003"); the
  /// post-local-sgd and diloco settings only in their modes.
  std::map<std::string, std::string> to_extras() const;
};

/// ValueError ("resume") listing every setting of `run` that the
/// checkpoint in `folder` holds otherwise in `saved` (its extras "run"), or
/// lacks: "checkpoint F was written by a different run (--optim: checkpoint
/// "zero", this run "ddp"; --ranks: checkpoint 3, this run 2)"; --ranks is
/// not compared when run.any_ranks. An ExtrasCheck (called on every rank, in the load's first half).
void check_compatible(const std::map<std::string, std::string>& saved, const RunInfo& run, const std::string& folder);

/// Rank 0's committed saves as lines for the lead to print: add() is the
/// Checkpointer's on_commit (the writer thread), take() the training loop's
/// (between steps, and after Checkpointer::wait()).
class CommitLog {
 public:
  explicit CommitLog(int keep_last) : keep_last_(keep_last) {}
  /// "checkpoint: F (step N)", "removed F (--keep-last K)", and once per
  /// folder "dopt-train: warning: --keep-last: kept F ...".
  void add(const dopt::CheckpointCommit& commit);
  /// The lines added since the last call.
  std::vector<std::string> take();

 private:
  int keep_last_;
  std::mutex m_;
  std::vector<std::string> lines_;
  std::set<std::string> warned_;
};

/// IOError ("checkpoint") when `resume_from`, or a folder in
/// `checkpoint_dir`, is a checkpoint of a dopt-train before the
/// Checkpointer ("format": "dopt-train-checkpoint/1" or "/2"): this one
/// neither resumes them nor saves beside them (a folder of both kinds would
/// confuse --resume and --keep-last). Names every such folder and how to go
/// on. Empty arguments are skipped; plain file reads, on each process.
void refuse_older_checkpoints(const std::string& checkpoint_dir, const std::string& resume_from);

/// --dump-params: every rank's `params` (named `names`), gathered to rank 0
/// and written to one safetensors file, tensors "rank{r}.{name}", with the
/// step in its metadata. Collective of `world`.
void dump_params(dopt::ProcessGroup& world, const std::vector<Tensor>& params, const std::vector<std::string>& names,
                 const std::string& path, std::int64_t step);

}  // namespace dopt_train
