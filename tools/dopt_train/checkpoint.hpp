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
// step, run, world size, manifest digest) in its metadata, and
// checkpoint.json is the manifest: a load checks every file it lists against
// it, so a folder that mixes files of two checkpoints is refused, naming the
// odd file and its step.
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

inline constexpr const char* kCheckpointFormat = "dopt-train-checkpoint/1";

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
/// ("dopt.checkpoint.step", ".run", ".world_size", ".manifest") and into
/// checkpoint.json.
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
  /// The metadata entries every file carries.
  std::map<std::string, std::string> metadata() const;
};

/// 16 random hex digits (a new run's id).
std::string new_run_id();

struct CheckpointInfo {
  std::string dir;
  std::int64_t step = 0;
  nlohmann::json meta;
  /// Absent for a checkpoint of a dopt-train before identities (its files
  /// are then checked for their step only).
  std::optional<CheckpointIdentity> identity;
};

/// Reads the header of every file the manifest lists and compares its
/// identity with the checkpoint's; IOError naming the first file that
/// differs, what it holds and the checkpoint's step ("... holds step 20 of
/// run X, but the checkpoint is step 40 of run X: the folder mixes files of
/// different checkpoints"), or that is missing or carries no identity.
void verify_checkpoint_files(const CheckpointInfo& ckpt);

/// "step-00000050".
std::string step_dir_name(std::int64_t step);
/// The complete checkpoint of the highest step under checkpoint_dir, if any
/// (none when the folder does not exist). IOError when the folder exists but
/// cannot be listed, or is not a folder.
std::optional<std::string> find_latest_checkpoint(const std::string& checkpoint_dir);
/// Creates checkpoint_dir (and its parents) and writes, syncs and removes a
/// small probe file in it (named after rank and process, so simulated ranks
/// do not collide). "" when that works, else what went wrong, for a message
/// ("cannot create /x/ck: Permission denied").
std::string probe_checkpoint_dir(const std::string& checkpoint_dir, int rank);
/// Removes the complete checkpoints of checkpoint_dir but the newest
/// keep_last (and leftover step-*.tmp folders older than the newest
/// complete one); returns the folders removed. keep_last <= 0 keeps all.
std::vector<std::string> prune_checkpoints(const std::string& checkpoint_dir, int keep_last);
/// Reads dir/checkpoint.json. IOError (naming the file) when it is missing or
/// not a dopt-train checkpoint.
CheckpointInfo read_checkpoint_info(const std::string& dir);
/// ValueError listing every setting that differs ("--optim: checkpoint ddp, this run zero").
void check_compatible(const CheckpointInfo& ckpt, const RunInfo& run);
/// Writes dir/checkpoint.json (the manifest: the identity and its files).
void write_checkpoint_info(const std::string& dir, const RunInfo& run, const CheckpointIdentity& id);

std::string model_file_name(int rank, int world_size);
/// This rank's parameters -> dir/model-rank{r}-of-{N}.safetensors, with the
/// checkpoint's identity in the metadata.
void save_model(const std::string& dir, int rank, const Mlp& model, const CheckpointIdentity& id);
/// Loads them back; IOError / StateDictError naming the file for anything that does not fit.
void load_model(const std::string& dir, int rank, int world_size, Mlp& model, std::int64_t step);

}  // namespace dopt_train
