// The plan dopt-train derives from its flags (plan.hpp).
#include "plan.hpp"

#include <algorithm>

#include "dopt/runtime/hyperparams.hpp"

namespace dopt_train {

StrategyConfig strategy_config(const Options& o) {
  StrategyConfig s;
  s.mode = o.optim;
  s.inner = inner_spec(o);
  s.plsgd_warmup = o.plsgd_warmup;
  s.plsgd_period = o.plsgd_period;
  s.plsgd_local_group = o.plsgd_local_group;
  s.diloco_sync_every = o.diloco_sync_every;
  s.diloco_fragments = o.diloco_fragments;
  s.diloco_delay = o.diloco_delay;
  s.diloco_alpha = o.diloco_alpha;
  s.diloco_outer_lr = o.diloco_outer_lr;
  s.diloco_outer_momentum = o.diloco_outer_momentum;
  s.diloco_wire = o.diloco_wire;
  s.diloco_error_feedback = o.diloco_error_feedback;
  s.survive = o.survive;
  s.survive_host_memory = o.survive_buddies == "host_memory";
  s.zero_stage = o.zero_stage;
  return s;
}

RunInfo run_info(const Options& o, const StrategyConfig& strategy, int world_size) {
  RunInfo r;
  r.optim = o.optim;
  r.inner = o.inner;
  r.ranks = world_size;
  r.any_ranks = o.elastic;
  r.seed = o.data.seed;
  r.hidden = o.hidden;
  r.layers = o.layers;
  r.batch = o.batch;
  r.data = o.data;
  r.lr = dopt::hyper_number(strategy.inner.hyperparameters, "lr", "dopt-train");
  r.plsgd_warmup = o.plsgd_warmup;
  r.plsgd_period = o.plsgd_period;
  r.plsgd_local_group = o.plsgd_local_group;
  r.diloco_sync_every = o.diloco_sync_every;
  r.diloco_fragments = o.diloco_fragments;
  r.diloco_delay = o.diloco_delay;
  r.diloco_alpha = o.diloco_alpha;
  r.diloco_outer_lr = o.diloco_outer_lr;
  r.diloco_outer_momentum = o.diloco_outer_momentum;
  r.diloco_wire = o.diloco_wire;
  r.diloco_error_feedback = o.diloco_error_feedback;
  return r;
}

std::map<std::string, std::string> join_compatibility(const Options& o, const RunInfo& run) {
  std::map<std::string, std::string> out;
  for (const auto& [name, json] : run.to_extras()) {
    // (The rank count is WORLD_SIZE, compared by dopt; input_dim and classes are no flags.)
    if (name == "ranks" || name == "input_dim" || name == "classes") continue;
    std::string flag = "--" + name, value = json;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    out[flag] = value;
  }
  auto given = [](bool b) { return std::string(b ? "(given)" : "(not given)"); };
  out["--steps"] = std::to_string(o.steps);
  out["--survive"] = given(o.survive);
  out["--survive-buddies"] = o.survive_buddies;
  out["--zero-stage"] = std::to_string(o.zero_stage);
  out["--nonfinite"] = o.nonfinite;
  out["--dump-params"] = given(!o.dump_params.empty());
  return out;
}

}  // namespace dopt_train
