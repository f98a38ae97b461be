// ZeroRedundancyOptimizer's state: consolidate_state_dict / state_dict /
// load_state_dict (torch's), and the sharded checkpoint (save_sharded /
// load_sharded, format in docs/zero.md).
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "dopt/optim/internal/state_check.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "dopt/optim/internal/state_load.hpp"
#include "zero_core.hpp"
#include "zero_internal.hpp"
#include "zero_state_dicts.hpp"
#include "zero/shard_files.hpp"

namespace dopt::optim::zero_detail {
namespace {

namespace fs = std::filesystem;

std::string join_ints(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::vector<std::int64_t> split_ints(const std::string& s, const std::string& what) {
  std::vector<std::int64_t> out;
  if (s.empty()) return out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw StateDictError("ZeroRedundancyOptimizer.load_sharded", what + ": not a list of integers: '" + s + "'");
    }
  }
  return out;
}

/// A loaded state entry for parameter p: `step` on the CPU, other tensors
/// cast to p's dtype on p's device (shape checked); 0-d tensors on the CPU.
/// `owned`: the tensors were just read from a file and nothing else holds
/// them, so one that already has the right dtype and device is taken as it
/// is (a load then holds one copy of the state, not two); otherwise every
/// tensor is copied (the caller's dict stays its own). `source(key)` names a
/// state tensor in errors (the file and entry, or the parameter index).
ParamState copy_state_for(const ParamState& st, const Tensor& p, std::int64_t index, const std::string& op,
                          bool owned, const std::function<std::string(const std::string&)>& source) {
  ParamState out;
  for (const auto& [key, value] : st) {
    if (!value.defined()) continue;
    check_state_value(op, source(key), key, value);
    if (key == "step") {
      out[key] = owned && value.device().is_cpu() ? value : value.to(Device::cpu());
      continue;
    }
    if (value.dim() != 0 && value.shape() != p.shape())
      throw StateDictError(op, "state '" + key + "' of parameter " + std::to_string(index) + " has shape " +
                                   shape_str(value.shape()) + " but the parameter has shape " +
                                   shape_str(p.shape()));
    const Device d = value.dim() == 0 ? Device::cpu() : p.device();
    if (owned && value.device() == d && value.dtype() == p.dtype()) {
      out[key] = value;
      continue;
    }
    Tensor t = Tensor::empty(value.shape(), p.dtype(), d);
    t.copy_(value);
    out[key] = std::move(t);
  }
  return out;
}

/// The end of both loads: `local` (the state of every parameter this rank
/// keeps) to the local optimizer and the redundancy's copies, `opts`
/// installed as the global hyperparameters.
void install(ZeroCore& z, StateByParam local, std::vector<std::unique_ptr<OptimizerOptions>> opts) {
  z.redundancy->install_state(z, std::move(local));
  auto& groups = z.params.groups();
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].options = std::move(opts[g]);
  z.sync_to_local();
}

}  // namespace

void StateDicts::consolidate(ZeroCore& z, int to) {
  const std::string op = std::string(kName) + ".consolidate_state_dict";
  z.require_overlap_idle(op);
  if (to < 0 || to >= z.world)
    throw ValueError(op, "to=" + std::to_string(to) + " is not a rank of the group (size " +
                             std::to_string(z.world) + ")", z.rank);
  z.sync_to_local();
  consolidated_.clear();
  auto cpu_copy = [](StateDict sd) {
    for (auto& [id, st] : sd.state)
      for (auto& [k, t] : st)
        if (t.defined()) t = t.device().is_cpu() ? t.clone() : t.to(Device::cpu());
    return sd;
  };
  std::vector<StateDict> gathered;
  for (int r = 0; r < z.world; ++r) {
    if (r == to) {
      if (z.rank == to) gathered.push_back(cpu_copy(z.optim->state_dict()));
      continue;
    }
    // Object broadcast from r: int64 length, then the safetensors bytes.
    Tensor len = Tensor::zeros({1}, DType::int64);
    std::string bytes;
    if (z.rank == r) {
      const SafetensorsFile f = state_dict_to_safetensors(z.optim->state_dict());
      bytes = serialize_safetensors(f.tensors, f.metadata);
      len.data<std::int64_t>()[0] = static_cast<std::int64_t>(bytes.size());
    }
    z.group.broadcast(len, r);
    const std::int64_t n = len.data<std::int64_t>()[0];
    Tensor payload = Tensor::empty({n}, DType::uint8);
    if (z.rank == r && n > 0) std::memcpy(payload.data_ptr(), bytes.data(), bytes.size());
    z.group.broadcast(payload, r);
    if (z.rank == to) {
      const std::string what = "consolidated state of rank " + std::to_string(r);
      gathered.push_back(state_dict_from_safetensors(
          parse_safetensors(payload.data_ptr(), static_cast<std::size_t>(n), what), what));
    }
  }
  consolidated_ = std::move(gathered);
}

StateDict StateDicts::global(const ZeroCore& z) const {
  z.require_overlap_idle(std::string(kName) + ".state_dict");
  if (consolidated_.empty())
    throw StateError(std::string(kName) + ".state_dict",
                     "Optimizer state has not been consolidated on this rank. Please call "
                     "`consolidate_state_dict(to=" +
                         std::to_string(z.rank) +
                         ")` on all ranks beforehand if you meant to save the global state.",
                     z.rank);
  StateDict out;
  for (const auto& g : z.params.groups()) {
    StateDict::Group og;
    og.hyperparams = g.options->to_hyperparams();
    for (const auto& p : g.params) og.params.push_back(z.params.index_of(p));
    out.param_groups.push_back(std::move(og));
  }
  for (std::size_t r = 0; r < consolidated_.size(); ++r) {
    const StateDict& local = consolidated_[r];
    const auto& part = z.part.of(static_cast<int>(r));
    for (std::size_t g = 0; g < local.param_groups.size() && g < part.size(); ++g) {
      const auto& ids = local.param_groups[g].params;
      for (std::size_t k = 0; k < ids.size() && k < part[g].size(); ++k) {
        auto it = local.state.find(ids[k]);
        if (it != local.state.end()) out.state[z.params.index_of(part[g][k])] = it->second;
      }
    }
  }
  return out;
}

void StateDicts::load(ZeroCore& z, const StateDict& sd) const {
  const std::string op = std::string(kName) + ".load_state_dict";
  z.require_overlap_idle(op);
  load_global(z, sd, op, /*owned=*/false);
}

void StateDicts::load_file(ZeroCore& z, const std::string& path) const {
  const std::string op = std::string(kName) + ".load_state_dict";
  z.require_overlap_idle(op);
  SafetensorsReader rd(path);
  // The dict without its tensors (the file's groups and names checked as
  // load_state_dict(path) checks them), then only the state this rank keeps
  // is read, each tensor once, straight into the tensor the optimizer keeps.
  SafetensorsFile names;
  names.metadata = rd.metadata();
  for (const auto& e : rd.entries()) names.tensors.emplace(e.name, Tensor());
  StateDict sd = state_dict_from_safetensors(names, path);
  const auto n = static_cast<std::int64_t>(z.params.size());
  for (auto& [index, st] : sd.state) {
    if (index < 0 || index >= n || !z.redundancy->keeps_state_of(z, static_cast<std::size_t>(index))) continue;
    for (auto& [key, value] : st) value = rd.read("state." + std::to_string(index) + "." + key);
  }
  if (!rd.has_checksums())
    notice_once(path + " has no checksums (written by an older dopt or another program): it is loaded without "
                       "verifying its bytes");
  load_global(z, sd, op, /*owned=*/true);
}

void StateDicts::load_global(ZeroCore& z, const StateDict& sd, const std::string& op, bool owned) const {
  if (sd.param_groups.size() != z.params.groups().size())
    throw StateDictError(op, "loaded state dict has a different number of parameter groups (" +
                                 std::to_string(sd.param_groups.size()) + " vs " + std::to_string(z.params.groups().size()) +
                                 ")", z.rank);
  for (std::size_t g = 0; g < z.params.groups().size(); ++g)
    if (sd.param_groups[g].params.size() != z.params.groups()[g].params.size())
      throw StateDictError(op, "loaded state dict contains a parameter group that doesn't match the size of "
                               "optimizer's group (group " + std::to_string(g) + ": " +
                               std::to_string(sd.param_groups[g].params.size()) + " vs " +
                               std::to_string(z.params.groups()[g].params.size()) + " parameters)", z.rank);
  auto opts = detail::loaded_options(z.params.groups(), [&](std::size_t g) { return sd.param_groups[g].hyperparams; }, op);
  std::unordered_map<const TensorImpl*, ParamState> local;
  for (const auto& [index, st] : sd.state) {
    if (index < 0 || index >= static_cast<std::int64_t>(z.params.size()))
      throw StateDictError(op, "state for parameter index " + std::to_string(index) + " but the optimizer has " +
                                   std::to_string(z.params.size()) + " parameters", z.rank);
    if (!z.redundancy->keeps_state_of(z, static_cast<std::size_t>(index))) continue;
    const Tensor& p = z.params.at(static_cast<std::size_t>(index));
    local[p.key()] = copy_state_for(st, p, index, op, owned, [&](const std::string& key) {
      return "state '" + key + "' of parameter " + std::to_string(index);
    });
  }
  install(z, std::move(local), std::move(opts));
}

StateDict StateDicts::shard(const ZeroCore& z, const std::map<std::string, std::string>& metadata,
                            const std::string& op, bool copy) const {
  z.require_overlap_idle(op);
  for (const auto& [k, v] : metadata)
    if (k.rfind("dopt.zero.", 0) == 0)
      throw ValueError(op, "the metadata key '" + k + "' is reserved for the shard's own description", z.rank);
  StateDict sd;
  const auto& mine = z.part.of(z.rank);
  std::vector<std::int64_t> sizes;
  for (std::size_t g = 0; g < z.params.groups().size(); ++g) {
    StateDict::Group og;
    og.hyperparams = z.params.groups()[g].options->to_hyperparams();
    for (const auto& p : mine[g]) {
      const std::int64_t idx = z.params.index_of(p);
      og.params.push_back(idx);
      auto it = z.optim->state().find(p.key());
      if (it == z.optim->state().end() || it->second.empty()) continue;
      if (!copy) {
        sd.state[idx] = it->second;
        continue;
      }
      ParamState& st = sd.state[idx];
      for (const auto& [key, value] : it->second) st[key] = value.defined() ? value.to(Device::cpu()) : value;
    }
    sd.param_groups.push_back(std::move(og));
    sizes.push_back(static_cast<std::int64_t>(z.params.groups()[g].params.size()));
    sd.metadata["dopt.zero.group_hyperparams." + std::to_string(g)] =
        hyper_to_json(z.params.groups()[g].options->to_hyperparams());
  }
  std::vector<std::int64_t> owners(z.part.owners().begin(), z.part.owners().end());
  sd.metadata["dopt.zero.format"] = kZeroShardFormat;
  sd.metadata["dopt.zero.world_size"] = std::to_string(z.world);
  sd.metadata["dopt.zero.rank"] = std::to_string(z.rank);
  sd.metadata["dopt.zero.partition"] = join_ints(owners);
  sd.metadata["dopt.zero.step"] = std::to_string(z.steps);
  sd.metadata["dopt.zero.group_sizes"] = join_ints(sizes);
  sd.metadata["dopt.zero.params"] = z.params.describe_all();
  sd.metadata["dopt.zero.optimizer"] = z.spec.name;
  for (const auto& [k, v] : metadata) sd.metadata[k] = v;
  return sd;
}

void StateDicts::save_sharded(const ZeroCore& z, const std::string& dir,
                              const std::map<std::string, std::string>& metadata) const {
  const std::string op = std::string(kName) + ".save_sharded";
  const StateDict sd = shard(z, metadata, op, /*copy=*/false);  // argument errors before any collective
  save_shard_everywhere(z.group, sd, dir, ZeroRedundancyOptimizer::shard_file_name(z.rank, z.world), op, z.rank);
}

ShardLoadReport StateDicts::load_sharded(ZeroCore& z, const std::string& dir) const {
  const std::string op = std::string(kName) + ".load_sharded";
  z.require_overlap_idle(op);
  static const std::regex re(R"(optim-rank(\d+)-of-(\d+)\.safetensors)");
  const int n = shard_world_size(dir, re, "optim-rank{r}-of-{N}.safetensors", &ZeroRedundancyOptimizer::shard_file_name,
                                 op, z.rank);
  auto path_of = [&](int r) { return (fs::path(dir) / ZeroRedundancyOptimizer::shard_file_name(r, n)).string(); };

  // Rank 0's header describes the checkpoint (every shard carries the same).
  std::unique_ptr<SafetensorsReader> reader0 = std::make_unique<SafetensorsReader>(path_of(0));
  const auto meta = reader0->metadata();
  auto get = [&](const std::string& key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) throw StateDictError(op, path_of(0) + ": metadata has no '" + key + "'", z.rank);
    return it->second;
  };
  if (get("dopt.zero.format") != kZeroShardFormat)
    throw StateDictError(op, path_of(0) + ": format '" + get("dopt.zero.format") + "', expected '" +
                                 kZeroShardFormat + "'", z.rank);
  if (get("dopt.zero.world_size") != std::to_string(n))
    throw StateDictError(op, path_of(0) + ": world size " + get("dopt.zero.world_size") +
                                 " does not match the file name", z.rank);
  if (get("dopt.zero.optimizer") != z.spec.name)
    throw StateDictError(op, "the checkpoint is of optimizer " + get("dopt.zero.optimizer") + ", this is " +
                                 z.spec.name, z.rank);
  const std::string shapes = z.params.describe_all();
  if (get("dopt.zero.params") != shapes)
    throw StateDictError(op, "the checkpoint's parameters (" + get("dopt.zero.params") +
                                 ") do not match this optimizer's (" + shapes + ")", z.rank);
  std::vector<std::int64_t> sizes;
  for (const auto& g : z.params.groups()) sizes.push_back(static_cast<std::int64_t>(g.params.size()));
  if (split_ints(get("dopt.zero.group_sizes"), "dopt.zero.group_sizes") != sizes)
    throw StateDictError(op, "the checkpoint's group sizes (" + get("dopt.zero.group_sizes") +
                                 ") do not match this optimizer's (" + join_ints(sizes) + ")", z.rank);
  const auto old_owner = split_ints(get("dopt.zero.partition"), "dopt.zero.partition");
  if (old_owner.size() != z.params.size())
    throw StateDictError(op, "the checkpoint's partition has " + std::to_string(old_owner.size()) +
                                 " entries for " + std::to_string(z.params.size()) + " parameters", z.rank);
  auto opts = detail::loaded_options(z.params.groups(), [&](std::size_t g) {
    return hyper_from_json(get("dopt.zero.group_hyperparams." + std::to_string(g)), op.c_str());
  }, op);
  const std::int64_t steps = split_ints(get("dopt.zero.step"), "dopt.zero.step").at(0);

  // The shards holding this rank's parameters, ascending.
  std::set<int> needed;
  for (std::size_t i = 0; i < z.params.size(); ++i)
    if (z.redundancy->keeps_state_of(z, i)) {
      const auto o = old_owner[i];
      if (o < 0 || o >= n) throw StateDictError(op, "the checkpoint's partition names rank " + std::to_string(o), z.rank);
      needed.insert(static_cast<int>(o));
    }
  ShardLoadReport report;
  report.saved_world_size = n;
  std::unordered_map<const TensorImpl*, ParamState> local;
  for (int s : needed) {
    std::unique_ptr<SafetensorsReader> rd;
    if (s == 0) rd = std::move(reader0);
    else {
      reader0.reset();
      rd = std::make_unique<SafetensorsReader>(path_of(s));
    }
    report.shards_read.push_back(s);
    auto it = rd->metadata().find("dopt.zero.rank");
    if (it == rd->metadata().end() || it->second != std::to_string(s) ||
        rd->metadata().count("dopt.zero.partition") == 0 ||
        rd->metadata().at("dopt.zero.partition") != get("dopt.zero.partition"))
      throw StateDictError(op, rd->path() + ": not rank " + std::to_string(s) + "'s shard of this checkpoint",
                           z.rank);
    auto st = rd->metadata().find("dopt.zero.step");
    const std::string its_step = st == rd->metadata().end() ? std::string("none") : st->second;
    if (its_step != get("dopt.zero.step"))
      throw StateDictError(op, rd->path() + " was saved at step " + its_step + " but " + path_of(0) + " at step " +
                                   get("dopt.zero.step") +
                                   ": the folder mixes shards of two checkpoints (refusing to load them)",
                           z.rank);
    std::map<std::int64_t, ParamState> states;
    for (const auto& e : rd->entries()) {
      // "state.{index}.{key}"
      if (e.name.rfind("state.", 0) != 0) continue;
      const auto dot = e.name.find('.', 6);
      if (dot == std::string::npos) continue;
      std::int64_t idx = -1;
      try {
        idx = std::stoll(e.name.substr(6, dot - 6));
      } catch (const std::exception&) {
        continue;
      }
      if (idx < 0 || idx >= static_cast<std::int64_t>(z.params.size()) ||
          old_owner[static_cast<std::size_t>(idx)] != s)
        throw StateDictError(op, rd->path() + ": tensor '" + e.name + "' is not a parameter this shard owns",
                             z.rank);
      if (!z.redundancy->keeps_state_of(z, static_cast<std::size_t>(idx))) continue;
      states[idx][e.name.substr(dot + 1)] = rd->read(e.name);
      ++report.tensors_read;
    }
    if (!rd->has_checksums())
      notice_once(rd->path() + " has no checksums (written by an older dopt or another program): its state is "
                               "loaded without verifying the bytes");
    for (const auto& [idx, st] : states) {
      const Tensor& p = z.params.at(static_cast<std::size_t>(idx));
      local[p.key()] = copy_state_for(st, p, idx, op, /*owned=*/true, [&](const std::string& key) {
        return rd->path() + ": tensor 'state." + std::to_string(idx) + "." + key + "'";
      });
    }
  }
  install(z, std::move(local), std::move(opts));
  z.steps = steps;
  return report;
}

}  // namespace dopt::optim::zero_detail

namespace dopt::optim {

StateDict zero_detail::shared_shard(ZeroRedundancyOptimizer& z, const std::map<std::string, std::string>& metadata) {
  const ZeroCore& core = ZeroCoreAccess::core(z);
  return core.dicts.shard(core, metadata, std::string(zero_detail::kName) + ".shard_state_dict", /*copy=*/false);
}

// With its implementation rather than with the other forwards in zero.cpp.
void ZeroRedundancyOptimizer::load_state_dict(const std::string& path) { core_->dicts.load_file(*core_, path); }

}  // namespace dopt::optim
