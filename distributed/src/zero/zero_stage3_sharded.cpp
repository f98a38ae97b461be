// ShardedUnits (zero_stage3.hpp), ZeRO stage 3: the sharded checkpoint, one
// file per rank holding that rank's shard of every unit (parameters and
// optimizer state), loadable at any world size (format in docs/zero-stage2-3.md).
// Rank thread only.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <utility>

#include "dopt/actors/internal/call_label.hpp"
#include "zero/shard_files.hpp"
#include "zero/zero_stage3_impl.hpp"

namespace dopt::optim {

using stage3_detail::kName;
using stage3_detail::Unit;

namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "dopt-zero3-shard/1";
/// The state key under which a unit's parameter shard travels.
constexpr const char* kParamKey = "dopt_param";

/// The units' shapes as JSON ([[shape, ...] per unit]): what a load checks.
std::string describe_units(const std::vector<Unit>& units) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& u : units) j.push_back(u.shapes);
  return j.dump();
}

/// The part of a unit's flat values a rank keeps at the new world size.
struct Piece {
  std::int64_t lo = 0, hi = 0;  // this rank's new part, without padding
};

}  // namespace

namespace stage3_detail {
struct Access {
  /// This rank's shards as a state dict; `copy`: the tensors are copies.
  static StateDict shard(const ShardedUnits& s, const std::map<std::string, std::string>& metadata,
                         const std::string& op, bool copy) {
    const ShardedUnits::Impl& im = *s.impl_;
    for (const auto& [k, v] : metadata)
      if (k.rfind("dopt.zero3.", 0) == 0)
        throw ValueError(op, "metadata key '" + k + "' is reserved (it starts with 'dopt.zero3.')", im.rank());
    StateDict sd = im.optim->state_dict();
    for (std::size_t u = 0; u < im.units.size(); ++u) {
      ParamState& st = sd.state[static_cast<std::int64_t>(u)];
      if (copy)
        for (auto& [k, t] : st) t = t.clone();
      st[kParamKey] = copy ? im.units[u].shard.clone() : im.units[u].shard;
    }
    sd.metadata["dopt.zero3.format"] = kFormat;
    sd.metadata["dopt.zero3.world_size"] = std::to_string(im.world());
    sd.metadata["dopt.zero3.rank"] = std::to_string(im.rank());
    sd.metadata["dopt.zero3.optimizer"] = im.spec.name;
    sd.metadata["dopt.zero3.units"] = describe_units(im.units);
    for (const auto& [k, v] : metadata) sd.metadata[k] = v;
    return sd;
  }
};

StateDict shared_shard(ShardedUnits& s, const std::map<std::string, std::string>& metadata) {
  return Access::shard(s, metadata, std::string(kName) + ".shard_state_dict",
                       /*copy=*/false);
}
}  // namespace stage3_detail

std::string ShardedUnits::shard_file_name(int rank, int world_size) {
  return "units-rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

StateDict ShardedUnits::shard_state_dict(const std::map<std::string, std::string>& metadata) const {
  return stage3_detail::Access::shard(*this, metadata, std::string(stage3_detail::kName) + ".shard_state_dict",
                                      /*copy=*/true);
}

void ShardedUnits::save_sharded(const std::string& dir, const std::map<std::string, std::string>& metadata) {
  dopt::detail::CallScope call_scope("ShardedUnits::save_sharded()");
  const std::string op = std::string(stage3_detail::kName) + ".save_sharded";
  Impl& im = *impl_;
  const StateDict sd = stage3_detail::Access::shard(*this, metadata, op,
                                                    /*copy=*/false);  // argument errors before the collective
  zero_detail::save_shard_everywhere(im.group, sd, dir, shard_file_name(im.rank(), im.world()), op, im.rank());
}

ShardLoadReport ShardedUnits::load_sharded(const std::string& dir) {
  const std::string op = std::string(stage3_detail::kName) + ".load_sharded";
  Impl& im = *impl_;
  const int rank = im.rank();
  static const std::regex re(R"(units-rank(\d+)-of-(\d+)\.safetensors)");
  const int n = zero_detail::shard_world_size(dir, re, "units-rank{r}-of-{N}.safetensors", &shard_file_name, op, rank);
  auto path_of = [&](int r) { return (fs::path(dir) / shard_file_name(r, n)).string(); };
  const std::string units_text = describe_units(im.units);

  // This rank's new part of each unit, and the old shards that hold it
  // (an empty part still needs one file: the state's keys and scalars).
  std::vector<Piece> pieces(im.units.size());
  std::set<int> needed;
  for (std::size_t u = 0; u < im.units.size(); ++u) {
    const Unit& unit = im.units[u];
    const std::int64_t old_s = (unit.numel + n - 1) / n;
    Piece& p = pieces[u];
    p.lo = std::min(unit.numel, rank * unit.shard_numel);
    p.hi = std::min(unit.numel, p.lo + unit.shard_numel);
    if (p.lo == p.hi) {
      needed.insert(0);
      continue;
    }
    for (std::int64_t k = p.lo / old_s; k <= (p.hi - 1) / old_s; ++k) needed.insert(static_cast<int>(k));
  }

  ShardLoadReport report;
  report.saved_world_size = n;
  std::vector<Tensor> params(im.units.size());
  std::vector<ParamState> states(im.units.size());
  std::vector<bool> seen(im.units.size(), false);
  StateDict::Group group;
  std::string first_file;
  for (const int k : needed) {
    const std::string path = path_of(k);
    StateDict sd = dopt::load_state_dict(path);
    auto meta = [&](const std::string& key) -> std::string {
      auto it = sd.metadata.find(key);
      if (it == sd.metadata.end()) throw StateDictError(op, path + ": metadata has no '" + key + "'", rank);
      return it->second;
    };
    if (meta("dopt.zero3.format") != kFormat)
      throw StateDictError(op, path + ": format '" + meta("dopt.zero3.format") + "', expected '" + kFormat + "'", rank);
    if (meta("dopt.zero3.world_size") != std::to_string(n) || meta("dopt.zero3.rank") != std::to_string(k))
      throw StateDictError(op,
                           path + ": written by rank " + meta("dopt.zero3.rank") + " of " +
                               meta("dopt.zero3.world_size") + ", which does not match its name",
                           rank);
    if (meta("dopt.zero3.optimizer") != im.spec.name)
      throw StateDictError(
          op, path + ": the checkpoint is of optimizer " + meta("dopt.zero3.optimizer") + ", this is " + im.spec.name,
          rank);
    if (meta("dopt.zero3.units") != units_text)
      throw StateDictError(op, path + ": its units are " + meta("dopt.zero3.units") + ", these are " + units_text,
                           rank);
    if (sd.param_groups.size() != 1)
      throw StateDictError(op, path + ": " + std::to_string(sd.param_groups.size()) + " groups, expected 1", rank);
    if (first_file.empty()) {
      first_file = path;
      group = sd.param_groups.front();
    }
    report.shards_read.push_back(k);
    for (std::size_t u = 0; u < im.units.size(); ++u) {
      const Unit& unit = im.units[u];
      const auto it = sd.state.find(static_cast<std::int64_t>(u));
      const std::string where = path + ": unit " + std::to_string(u);
      if (it == sd.state.end() || !it->second.count(kParamKey))
        throw StateDictError(op, where + " has no '" + kParamKey + "'", rank);
      const ParamState& st = it->second;
      const std::int64_t old_s = (unit.numel + n - 1) / n;
      ParamState& mine = states[u];
      if (!seen[u]) {  // the first file with this unit: the keys, dtypes and
                       // scalars
        seen[u] = true;
        params[u] = Tensor::zeros({unit.shard_numel});
        for (const auto& [key, t] : st) {
          if (key == kParamKey) continue;
          mine[key] = t.dim() == 0 ? t.clone() : Tensor::zeros({unit.shard_numel}, t.dtype());
        }
      } else {
        for (const auto& [key, t] : st)
          if (key != kParamKey && !mine.count(key))
            throw StateDictError(op, where + " has state '" + key + "' that " + first_file + " has not", rank);
      }
      for (const auto& [key, t] : mine) {
        const auto s = st.find(key);
        if (s == st.end()) throw StateDictError(op, where + " has no state '" + key + "'", rank);
        if (t.dim() == 0 && !s->second.equal(t))
          throw StateDictError(op,
                               where + ": state '" + key + "' is " + s->second.str() + ", " + first_file + " has " +
                                   t.str() + " (shards of two checkpoints in one folder)",
                               rank);
      }
      const Piece& p = pieces[u];
      const std::int64_t a = std::max(p.lo, k * old_s), b = std::min(p.hi, (k + 1) * old_s);
      if (a >= b) continue;
      auto copy_part = [&](const Tensor& from, const Tensor& to, const std::string& what) {
        if (from.dim() != 1 || from.numel() != old_s || from.dtype() != to.dtype())
          throw StateDictError(op,
                               where + ": '" + what + "' is " + from.str() + ", expected " + std::to_string(old_s) +
                                   " elements of " + to.str(),
                               rank);
        to.flat_slice(a - p.lo, b - a).copy_(from.flat_slice(a - k * old_s, b - a));
        ++report.tensors_read;
      };
      copy_part(st.at(kParamKey), params[u], kParamKey);
      for (const auto& [key, t] : mine)
        if (t.dim() != 0) copy_part(st.at(key), t, key);
    }
  }

  // Everything read and checked: install it.
  StateDict local;
  group.params.clear();
  for (std::size_t u = 0; u < im.units.size(); ++u) {
    group.params.push_back(static_cast<std::int64_t>(u));
    if (!states[u].empty()) local.state[static_cast<std::int64_t>(u)] = std::move(states[u]);
  }
  local.param_groups.push_back(std::move(group));
  for (std::size_t u = 0; u < im.units.size(); ++u) release(u);  // gathers in flight read the shards
  im.optim->load_state_dict(local);
  for (std::size_t u = 0; u < im.units.size(); ++u) im.units[u].shard.copy_(params[u]);
  return report;
}

}  // namespace dopt::optim
