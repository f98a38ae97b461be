// Replay of wrapper 'post_local_sgd': the real PostLocalSGDOptimizer with a
// PeriodicModelAverager over c.world_size simulated ranks
// (../shared/conformance/FORMAT.md).
#include <filesystem>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "replay_case.hpp"

namespace dopt::replay {

ReplayOutput replay_post_local_sgd(const Case& c, int num_threads) {
  static constexpr const char* op = "replay_post_local_sgd";
  const std::size_t n = c.shapes.size();

  // Case has no field for wrapper.averager: read it from case.json.
  std::int64_t period = 0, warmup = 0;
  {
    const std::string json_file = (std::filesystem::path(c.dir) / "case.json").string();
    std::ifstream in(json_file);
    if (!in) throw IOError(op, json_file + ": cannot open");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw IOError(op, json_file + ": not valid JSON: " + e.what());
    }
    const auto& w = j.at("wrapper");
    auto a = w.find("averager");
    if (a == w.end() || !a->is_object()) throw IOError(op, json_file + ": wrapper has no 'averager' object");
    auto kind = a->find("kind");
    if (kind == a->end() || !kind->is_string()) throw IOError(op, json_file + ": wrapper.averager has no 'kind'");
    if (*kind != "periodic")
      throw UnsupportedCase(op, "averager kind " + kind->dump() + " is not supported (only \"periodic\")");
    for (auto [key, dst] : {std::pair{"period", &period}, std::pair{"warmup_steps", &warmup}}) {
      auto it = a->find(key);
      if (it == a->end() || !it->is_number_integer())
        throw IOError(op, json_file + ": wrapper.averager." + key + " must be an integer");
      *dst = it->get<std::int64_t>();
    }
  }

  ReplayOutput out;
  std::mutex m;
  simulate(c.world_size, [&](RankContext& ctx) {
    const int r = ctx.rank();
    std::vector<Tensor> params;
    for (std::size_t i = 0; i < n; ++i) params.push_back(c.tensors.at("init." + std::to_string(i)).clone());
    auto local = make_case_optimizer(c, params);
    local->set_num_threads(num_threads);
    optim::PostLocalSGDOptimizer opt(std::move(local),
                                     std::make_unique<optim::PeriodicModelAverager>(period, warmup, ctx.world()));

    std::map<std::string, Tensor> mine;
    for (int t = 0; t < c.steps; ++t) {
      set_case_grads(c, t, r, params);
      opt.step();
      record_case_params(t, r, params, mine);
    }
    for (const auto& [key, st] : opt.state()) {
      std::int64_t case_index = -1;
      for (std::size_t i = 0; i < n; ++i)
        if (params[i].key() == key) case_index = static_cast<std::int64_t>(i);
      if (case_index < 0) throw StateError(op, "optimizer state for a tensor that is not a parameter");
      for (const auto& [name, t] : st) {
        if (!t.defined()) continue;
        mine["state." + std::to_string(r) + "." + std::to_string(case_index) + "." + name] = t.to(c.dtype);
      }
    }
    std::lock_guard<std::mutex> lock(m);
    out.tensors.merge(mine);
  });
  out.metadata["format"] = "dopt-trace/1";
  out.metadata["generator"] = "dopt-replay";
  return out;
}

}  // namespace dopt::replay
