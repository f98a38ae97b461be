#pragma once
// dopt-train's checkpoints (docs/dopt-train.md, "Checkpoints").
//
// --checkpoint-dir D holds one folder per checkpoint, D/step-00000050/ with
//   checkpoint.json                      what was trained and where it stopped
//                                        (written last: its presence marks a
//                                        complete checkpoint)
//   model-rank{r}-of-{N}.safetensors     rank r's parameters (differ between
//                                        ranks only with post-local SGD)
//   optim-rank{r}-of-{N}.safetensors     rank r's optimizer state: ZeRO's
//                                        save_sharded shard, or the local
//                                        optimizer's state dict
// A checkpoint is written into step-XXXXXXXX.tmp/ and renamed once complete.
// Every file of it carries the checkpoint's identity (CheckpointIdentity:
// step, run, world size, manifest digest) and the rank that wrote it in its
// metadata, and checkpoint.json is the manifest: a load checks every file it
// lists against it, so a folder that mixes files of two checkpoints, or
// whose ranks' files were swapped, is refused, naming the odd file. The
// folder's name is the step its checkpoint.json holds; a folder whose name
// disagrees is refused by --resume and never removed by --keep-last.
// Nothing else is needed to resume: the data order is a pure function of
// (seed, step, rank), so the step is the data position.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model.hpp"

namespace dopt_train {

/// checkpoint.json's "format": the current one (2: carries "identity", every
/// file carries its rank) and the older one (1: "identity" optional, files
/// without ranks), which still resumes.
inline constexpr const char* kCheckpointFormat = "dopt-train-checkpoint/2";
inline constexpr const char* kCheckpointFormatOld = "dopt-train-checkpoint/1";

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
  nlohmann::json to_json() const;
};

/// Who a checkpoint is: written into the metadata of each of its files
/// ("dopt.checkpoint.step", ".run", ".world_size", ".manifest", and ".rank",
/// the rank that wrote the file) and into checkpoint.json.
struct CheckpointIdentity {
  std::int64_t step = 0;
  /// The training run: 16 hex digits drawn when a run starts from step 0,
  /// kept by the runs that resume it.
  std::string run;
  int world_size = 0;
  /// Every file of the checkpoint but checkpoint.json, sorted.
  std::vector<std::string> files;
  /// The model and optimizer files of every rank.
  static CheckpointIdentity of(std::int64_t step, const std::string& run, int world_size);
  /// 16 hex digits: XXH3-64 of step, run, world size and the file names.
  std::string manifest_digest() const;
  /// The metadata entries of rank's file: the identity and
  /// "dopt.checkpoint.rank" = rank ("all" for rank < 0: a file every rank
  /// writes alike; dopt-train writes none).
  std::map<std::string, std::string> metadata(int rank) const;
  /// The rank whose file `file` is (model-rank{r}-of-{N}, optim-rank{r}-of-{N}),
  /// -1 for a name that is not one of this checkpoint's per-rank files.
  int rank_of(const std::string& file) const;
};

/// 16 random hex digits (a new run's id).
std::string new_run_id();

struct CheckpointInfo {
  std::string dir;
  std::int64_t step = 0;
  /// 2 (kCheckpointFormat) or 1 (kCheckpointFormatOld).
  int format = 2;
  nlohmann::json meta;
  /// Always there in format 2; absent only in a format-1 checkpoint of a
  /// dopt-train before identities (its files are then checked for their
  /// step only).
  std::optional<CheckpointIdentity> identity;
};

/// Reads the header of every file of the checkpoint (the manifest's, or for
/// a format-1 checkpoint without identity the model and optimizer files of
/// its ranks) and compares it with the checkpoint; IOError ("resume") naming
/// the first file that differs, what it holds and what was expected:
/// another step or run ("... holds step 20 of run X, but the checkpoint is
/// step 40 of run X: the folder mixes files of different checkpoints"),
/// another rank ("... holds rank 1's file, but rank 0 loads it"), no
/// identity or no rank in a format-2 checkpoint, an identity in a checkpoint
/// whose checkpoint.json has none, or a missing file.
void verify_checkpoint_files(const CheckpointInfo& ckpt);
/// IOError ("resume") when `meta` (the metadata of the file at path) names a
/// rank other than `rank`, the rank loading it: "PATH holds rank 1's file
/// (dopt.checkpoint.rank), but rank 0 loads it". No rank: an error when
/// `required`.
void check_file_rank(const std::string& path, const std::map<std::string, std::string>& meta, int rank,
                     bool required);

/// "step-00000050".
std::string step_dir_name(std::int64_t step);
/// The complete checkpoint of the highest step under checkpoint_dir, if any
/// (none when the folder does not exist), the step read from each folder's
/// checkpoint.json. IOError ("resume") when the folder exists but cannot be
/// listed or is not a folder, when a step-XXXXXXXX folder's checkpoint.json
/// cannot be read, or when a folder's name disagrees with the step it holds
/// (naming every such folder, the step its name says and the one it holds).
std::optional<std::string> find_latest_checkpoint(const std::string& checkpoint_dir);
/// Creates checkpoint_dir (and its parents) and writes, syncs and removes a
/// small probe file in it (named after rank and process, so simulated ranks
/// do not collide). "" when that works, else what went wrong, for a message
/// ("cannot create /x/ck: Permission denied").
std::string probe_checkpoint_dir(const std::string& checkpoint_dir, int rank);
/// Removes the complete checkpoints of checkpoint_dir but the newest
/// keep_last, newest by the step each checkpoint.json holds (and leftover
/// step-*.tmp folders older than the newest complete one); returns the
/// folders removed. A folder whose checkpoint.json cannot be read, or whose
/// name disagrees with the step it holds, is neither removed nor counted: a
/// line for each goes to *kept (when given). keep_last <= 0 keeps all.
std::vector<std::string> prune_checkpoints(const std::string& checkpoint_dir, int keep_last,
                                           std::vector<std::string>* kept = nullptr);
/// Reads dir/checkpoint.json. IOError ("resume", naming the file) when it is
/// missing or not a dopt-train checkpoint, when a format-2 file carries no
/// identity, or when dir is named step-XXXXXXXX for another step than the
/// one it holds.
CheckpointInfo read_checkpoint_info(const std::string& dir);
/// ValueError listing every setting that differs ("--optim: checkpoint ddp, this run zero").
void check_compatible(const CheckpointInfo& ckpt, const RunInfo& run);
/// Writes dir/checkpoint.json (the manifest: the identity and its files).
void write_checkpoint_info(const std::string& dir, const RunInfo& run, const CheckpointIdentity& id);

std::string model_file_name(int rank, int world_size);
/// This rank's parameters -> dir/model-rank{r}-of-{N}.safetensors, with the
/// checkpoint's identity in the metadata.
void save_model(const std::string& dir, int rank, const Mlp& model, const CheckpointIdentity& id);
/// Loads them back; IOError / StateDictError naming the file for anything
/// that does not fit (another step; another rank: check_file_rank).
void load_model(const std::string& dir, int rank, int world_size, Mlp& model, std::int64_t step);

}  // namespace dopt_train
