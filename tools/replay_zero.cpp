// Replay of wrapper 'zero': the real ZeroRedundancyOptimizer over
// c.world_size simulated ranks (../shared/conformance/FORMAT.md).
#include <filesystem>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/clip_grad.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "replay_case.hpp"

namespace dopt::replay {

ReplayOutput replay_zero(const Case& c, int num_threads) {
  const std::size_t n = c.shapes.size();
  // ZeRO's global index = position in the chain of groups; the case's index may differ.
  std::vector<std::int64_t> chain;
  for (const auto& g : c.groups) chain.insert(chain.end(), g.params.begin(), g.params.end());

  bool bucket_view = false;
  {
    // Case has no field for wrapper.parameters_as_bucket_view: read it from case.json.
    const std::string json_file = (std::filesystem::path(c.dir) / "case.json").string();
    std::ifstream in(json_file);
    if (!in) throw IOError("replay_zero", json_file + ": cannot open");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw IOError("replay_zero", json_file + ": not valid JSON: " + e.what());
    }
    const auto& w = j.at("wrapper");
    if (auto it = w.find("parameters_as_bucket_view"); it != w.end()) {
      if (!it->is_boolean())
        throw IOError("replay_zero", json_file + ": wrapper.parameters_as_bucket_view must be true or false");
      bucket_view = it->get<bool>();
    }
  }

  ReplayOutput out;
  std::mutex m;
  std::vector<int> owners_by_case(n, -1);
  simulate(c.world_size, [&](RankContext& ctx) {
    const int r = ctx.rank();
    std::vector<Tensor> params;
    for (std::size_t i = 0; i < n; ++i) params.push_back(c.tensors.at("init." + std::to_string(i)).clone());
    std::vector<optim::OptimizerParamGroup> groups = case_param_groups(c, params);
    optim::ZeroOptions zo;
    zo.process_group = ctx.world();
    zo.parameters_as_bucket_view = bucket_view;
    optim::ZeroRedundancyOptimizer zero(std::move(groups), optim::OptimizerSpec{c.optimizer_class, c.defaults}, zo);
    zero.optim().set_num_threads(num_threads);

    std::map<std::string, Tensor> mine;
    // The scheduler is built on the ZeRO object on every rank (as a ZeRO
    // user does); its values are the same everywhere, rank 0 records them.
    std::unique_ptr<CaseScheduler> sched;
    std::map<std::string, Tensor> discard;
    if (!c.lr_scheduler.empty()) {
      sched = std::make_unique<CaseScheduler>(c, optim::ScheduleTarget(zero));
      sched->record("init", r == 0 ? mine : discard);
    }
    for (int t = 0; t < c.steps; ++t) {
      set_case_grads(c, t, r, params);
      if (c.clip_grad_norm) {
        // Sharded: each rank the norms of the gradients it owns, one all-reduce.
        // The total runs over ZeRO's global order (the chain of groups), which
        // is the case's index order when the groups list ascending indices.
        optim::ClipGradNormOptions o;
        o.norm_type = c.clip_grad_norm->norm_type;
        record_grad_norm(c, t, r, optim::clip_grad_norm(zero, c.clip_grad_norm->max_norm, o), mine);
      }
      zero.step();
      if (sched) {
        sched->step(t);
        sched->record(std::to_string(t), r == 0 ? mine : discard);
      }
      record_case_params(t, r, params, mine);
    }
    // The state this rank holds: its local optimizer's, by parameter.
    for (const auto& [key, st] : zero.optim().state()) {
      std::int64_t case_index = -1;
      for (std::size_t i = 0; i < n; ++i)
        if (params[i].key() == key) case_index = static_cast<std::int64_t>(i);
      if (case_index < 0) throw StateError("replay_zero", "local state for a tensor that is not a parameter");
      for (const auto& [name, t] : st) {
        if (!t.defined()) continue;
        mine["state." + std::to_string(r) + "." + std::to_string(case_index) + "." + name] = t.to(c.dtype);
      }
    }
    const auto owners = zero.param_owners();
    std::lock_guard<std::mutex> lock(m);
    for (std::size_t pos = 0; pos < owners.size(); ++pos)
      owners_by_case[static_cast<std::size_t>(chain[pos])] = owners[pos];
    out.tensors.merge(mine);
  });

  std::string partition;
  for (std::size_t i = 0; i < n; ++i) partition += (i ? "," : "") + std::to_string(owners_by_case[i]);
  out.metadata["format"] = "dopt-trace/1";
  out.metadata["generator"] = "dopt-replay";
  out.metadata["zero_partition"] = partition;
  return out;
}

}  // namespace dopt::replay
