// Replay of wrapper 'diloco' (torchft's DiLoCo / Streaming DiLoCo): the real
// PostLocalSGDOptimizer with a DiLoCoAverager over c.world_size simulated
// ranks (../shared/conformance/FORMAT.md).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "replay_case.hpp"

namespace dopt::replay {

namespace {

/// The wrapper's fields as DiLoCoOptions (read from case.json: Case keeps only the kind).
optim::DiLoCoOptions read_diloco_options(const Case& c) {
  static constexpr const char* op = "replay_diloco";
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
  auto need = [&](const char* key) -> const nlohmann::json& {
    auto it = w.find(key);
    if (it == w.end()) throw IOError(op, json_file + ": wrapper has no '" + std::string(key) + "'");
    return *it;
  };
  optim::DiLoCoOptions o;
  const auto& se = need("sync_every");
  if (!se.is_number_integer()) throw IOError(op, json_file + ": wrapper.sync_every must be an integer");
  o.sync_every = se.get<std::int64_t>();
  const auto& d = need("fragment_sync_delay");
  if (!d.is_number_integer()) throw IOError(op, json_file + ": wrapper.fragment_sync_delay must be an integer");
  o.fragment_sync_delay = d.get<std::int64_t>();
  const auto& a = need("fragment_update_alpha");
  if (!a.is_number()) throw IOError(op, json_file + ": wrapper.fragment_update_alpha must be a number");
  o.fragment_update_alpha = a.get<double>();
  const auto& f = need("fragments");
  if (!f.is_array()) throw IOError(op, json_file + ": wrapper.fragments must be an array of arrays");
  for (const auto& frag : f) {
    if (!frag.is_array()) throw IOError(op, json_file + ": wrapper.fragments must be an array of arrays");
    std::vector<std::int64_t> ids;
    for (const auto& i : frag) {
      if (!i.is_number_integer()) throw IOError(op, json_file + ": wrapper.fragments holds a non-integer");
      ids.push_back(i.get<std::int64_t>());
    }
    o.fragments.push_back(std::move(ids));
  }
  const auto& oo = need("outer_optimizer");
  if (!oo.is_object() || !oo.contains("class") || !oo.contains("defaults") || !oo["class"].is_string())
    throw IOError(op, json_file + ": wrapper.outer_optimizer must be an object with 'class' and 'defaults'");
  o.outer_optimizer.name = oo["class"].get<std::string>();
  o.outer_optimizer.hyperparameters = hyper_from_json(oo["defaults"].dump(), op);
  const auto names = optim::registered_optimizers();
  if (std::find(names.begin(), names.end(), o.outer_optimizer.name) == names.end())
    throw UnsupportedCase(op, "outer optimizer class '" + o.outer_optimizer.name + "' is not supported");
  return o;
}

std::int64_t index_of(const std::vector<Tensor>& ts, const TensorImpl* key) {
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (ts[i].key() == key) return static_cast<std::int64_t>(i);
  return -1;
}

}  // namespace

ReplayOutput replay_diloco(const Case& c, int num_threads) {
  static constexpr const char* op = "replay_diloco";
  const std::size_t n = c.shapes.size();
  const optim::DiLoCoOptions options = read_diloco_options(c);

  ReplayOutput out;
  std::mutex m;
  simulate(c.world_size, [&](RankContext& ctx) {
    const int r = ctx.rank();
    const std::string rs = std::to_string(r);
    std::vector<Tensor> params;
    for (std::size_t i = 0; i < n; ++i) params.push_back(c.tensors.at("init." + std::to_string(i)).clone());
    auto inner = make_case_optimizer(c, params);
    inner->set_num_threads(num_threads);
    // The averager's parameter indices are the case's global indices.
    auto averager = std::make_unique<optim::DiLoCoAverager>(params, options, ctx.world());
    const optim::DiLoCoAverager& diloco = *averager;
    optim::PostLocalSGDOptimizer opt(std::move(inner), std::move(averager));

    std::map<std::string, Tensor> mine;
    for (int t = 0; t < c.steps; ++t) {
      set_case_grads(c, t, r, params);
      opt.step();
      record_case_params(t, r, params, mine);
      for (std::size_t i = 0; i < n; ++i)
        mine["anchor." + std::to_string(t) + "." + rs + "." + std::to_string(i)] = diloco.anchors()[i].clone();
    }
    for (const auto& [key, st] : opt.state()) {
      const std::int64_t i = index_of(params, key);
      if (i < 0) throw StateError(op, "optimizer state for a tensor that is not a parameter");
      for (const auto& [name, t] : st)
        if (t.defined()) mine["state." + rs + "." + std::to_string(i) + "." + name] = t.to(c.dtype);
    }
    for (std::size_t k = 0; k < diloco.fragments().size(); ++k)
      for (const auto& [key, st] : diloco.outer_optimizer(k).state()) {
        const std::int64_t i = index_of(diloco.anchors(), key);
        if (i < 0) throw StateError(op, "outer optimizer state for a tensor that is not an anchor");
        for (const auto& [name, t] : st)
          if (t.defined()) mine["outer." + rs + "." + std::to_string(i) + "." + name] = t.to(c.dtype);
      }
    std::lock_guard<std::mutex> lock(m);
    out.tensors.merge(mine);
  });
  out.metadata["format"] = "dopt-trace/1";
  out.metadata["generator"] = "dopt-replay";
  return out;
}

}  // namespace dopt::replay
