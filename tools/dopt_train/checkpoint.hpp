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
  nlohmann::json to_json() const;
};

struct CheckpointInfo {
  std::string dir;
  std::int64_t step = 0;
  nlohmann::json meta;
};

/// "step-00000050".
std::string step_dir_name(std::int64_t step);
/// The complete checkpoint of the highest step under checkpoint_dir, if any.
std::optional<std::string> find_latest_checkpoint(const std::string& checkpoint_dir);
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
