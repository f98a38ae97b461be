#pragma once
// What dopt-train was asked to do (parsed flags) and the plan main() derives
// from them; shared by the training loops (main.cpp, remote.cpp).
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "checkpoint.hpp"
#include "dopt/optim/registry.hpp"
#include "model.hpp"
#include "strategy.hpp"

namespace dopt_train {

struct Options {
  std::string optim = "zero";
  std::string inner = "adam";
  int ranks = 4;
  std::int64_t steps = 2000;
  double lr = 0;  // 0: the inner optimizer's default below
  int batch = 32;
  int hidden = 256;
  int layers = 4;
  DataSpec data;
  std::int64_t checkpoint_every = 0;
  std::string checkpoint_dir;
  bool resume = false;               // --resume given (resume_mode says how)
  std::string resume_mode = "auto";  // auto: the latest checkpoint if any, else from scratch; required
  std::string resume_from;
  bool elastic = false;              // --elastic: resume a checkpoint of another rank count
  int keep_last = 0;                 // 0: keep every checkpoint
  std::string nonfinite = "error";   // error | warn
  std::string metrics, svg, dump_params;
  bool quiet = false;
  std::int64_t log_every = 0;
  std::int64_t interrupt_at_step = 0;  // testing: raise SIGINT at this step
  std::int64_t plsgd_warmup = 20, plsgd_period = 4;
  int plsgd_local_group = 1;
  std::int64_t diloco_sync_every = 50;
  int diloco_fragments = 1;
  std::int64_t diloco_delay = 0;
  double diloco_alpha = 0.0, diloco_outer_lr = 0.7, diloco_outer_momentum = 0.9;
  std::string diloco_wire = "float32";
  bool diloco_error_feedback = false;
  std::string svg_bytes;
  bool survive = false;           // --survive: go on with the survivors when a rank is lost
  std::string survive_buddies = "step";  // --survive-buddies
  int zero_stage = 1;                     // --zero-stage (--optim zero)
  int kill_rank = -1;             // --kill-rank: this rank dies ...
  std::int64_t kill_at_step = 0;  // --kill-at-step: ... once this many steps are done
};

// Inner optimizers: the torch class name and a learning rate that trains this MLP well.
inline const std::map<std::string, std::pair<std::string, double>> kInner = {
    {"adam", {"Adam", 3e-3}},         {"adamw", {"AdamW", 3e-3}},   {"sgd", {"SGD", 0.1}},
    {"adagrad", {"Adagrad", 0.05}},   {"rmsprop", {"RMSprop", 1e-3}}, {"adamax", {"Adamax", 6e-3}},
    {"adadelta", {"Adadelta", 1.0}},  {"rprop", {"Rprop", 1e-3}}};

inline dopt::optim::OptimizerSpec inner_spec(const Options& o) {
  const auto& [name, lr] = kInner.at(o.inner);
  dopt::optim::OptimizerSpec spec{name, {}};
  spec.hyperparameters["lr"] = o.lr > 0 ? o.lr : lr;
  if (o.inner == "sgd") spec.hyperparameters["momentum"] = 0.9;
  return spec;
}

/// The strategy's configuration from the flags.
StrategyConfig strategy_config(const Options& o);
/// What must match between a checkpoint and the run resuming it (--ranks:
/// `world_size`; --lr: the strategy's inner learning rate).
RunInfo run_info(const Options& o, const StrategyConfig& strategy, int world_size);
/// The flags a process that joins the running job (a later node of dopt-run
/// --nnodes MIN:MAX, a replacement) must share with it, as
/// InitOptions::compatibility: flag -> value ("--hidden" -> "64"): the
/// settings of `run` but the rank count (dopt compares WORLD_SIZE itself),
/// --steps, --survive, --survive-buddies, --zero-stage, --nonfinite and
/// whether --dump-params is given (its gather is a collective).
std::map<std::string, std::string> join_compatibility(const Options& o, const RunInfo& run);

struct Plan {
  Options opt;
  RunInfo run;
  StrategyConfig strategy;
  int world_size = 1;
  bool launched = false;
  /// A replacement of a lost rank (DOPT_REPLACES, dopt-run --on-failure
  /// replace): it joins the running job (--survive) instead of starting one.
  bool replacement = false;
  long long incarnation = 0;  // DOPT_INCARNATION
};


}  // namespace dopt_train
