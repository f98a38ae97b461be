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
// Nothing else is needed to resume: the data order is a pure function of
// (seed, step, rank), so the step is the data position.
#include <cstdint>
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

struct CheckpointInfo {
  std::string dir;
  std::int64_t step = 0;
  nlohmann::json meta;
};

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
/// Writes dir/checkpoint.json.
void write_checkpoint_info(const std::string& dir, const RunInfo& run, std::int64_t step);

std::string model_file_name(int rank, int world_size);
/// This rank's parameters -> dir/model-rank{r}-of-{N}.safetensors.
void save_model(const std::string& dir, int rank, int world_size, const Mlp& model, std::int64_t step);
/// Loads them back; IOError / StateDictError naming the file for anything that does not fit.
void load_model(const std::string& dir, int rank, int world_size, Mlp& model, std::int64_t step);

}  // namespace dopt_train
