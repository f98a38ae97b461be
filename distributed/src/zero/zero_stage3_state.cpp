// ShardedUnits (zero_stage3.hpp), ZeRO stage 3: the consolidated state dict
// in torch's layout (every shard's state all-gathered and cut back into the
// parameters' shapes), its load (this rank's part of each tensor), and the
// full parameters. Rank thread only.
#include <algorithm>
#include <string>
#include <utility>

#include "zero/zero_stage3_impl.hpp"

namespace dopt::optim {

using stage3_detail::Unit;

namespace {

/// Copies this rank's part of a unit's flat values, given per parameter in
/// the parameters' shapes, into `dst` ([S], zeros where the padding is).
void copy_own_part(const Unit& unit, int rank, const std::vector<Tensor>& per_param, const Tensor& dst) {
  const std::int64_t lo = rank * unit.shard_numel, hi = lo + unit.shard_numel;
  dst.fill_(0.0);
  for (std::size_t i = 0; i < per_param.size(); ++i) {
    const std::int64_t n = shape_numel(unit.shapes[i]);
    const std::int64_t a = std::max(lo, unit.offsets[i]), b = std::min(hi, unit.offsets[i] + n);
    if (a >= b) continue;
    dst.flat_slice(a - lo, b - a).copy_(per_param[i].view({n}).flat_slice(a - unit.offsets[i], b - a));
  }
}

}  // namespace

StateDict ShardedUnits::state_dict() {
  Impl& im = *impl_;
  const StateDict local = im.optim->state_dict();
  StateDict out;
  std::int64_t base = 0;
  for (std::size_t u = 0; u < im.units.size(); ++u) {
    const Unit& unit = im.units[u];
    const auto it = local.state.find(static_cast<std::int64_t>(u));
    if (it != local.state.end()) {
      for (const auto& [key, t] : it->second) {
        if (t.dim() == 0) {
          for (std::size_t i = 0; i < unit.shapes.size(); ++i)
            out.state[base + static_cast<std::int64_t>(i)][key] = t.clone();
          continue;
        }
        Tensor all = Tensor::empty({unit.shard_numel * im.world()}, t.dtype());
        im.group.all_gather_into_tensor(all, t);
        const auto views = Impl::views(unit, all);
        for (std::size_t i = 0; i < views.size(); ++i)
          out.state[base + static_cast<std::int64_t>(i)][key] = views[i].clone();
      }
    }
    base += static_cast<std::int64_t>(unit.shapes.size());
  }
  StateDict::Group group;
  group.hyperparams = local.param_groups.front().hyperparams;
  for (std::int64_t g = 0; g < base; ++g) group.params.push_back(g);
  out.param_groups.push_back(std::move(group));
  return out;
}

void ShardedUnits::load_state_dict(const StateDict& sd) {
  static constexpr const char* op = "ShardedUnits.load_state_dict";
  Impl& im = *impl_;
  const int rank = im.rank();
  std::size_t total = 0;
  for (const auto& unit : im.units) total += unit.shapes.size();
  if (sd.param_groups.size() != 1 || sd.param_groups.front().params.size() != total)
    throw StateDictError(op, "the state dict has " + std::to_string(sd.param_groups.size()) +
                                 " group(s); stage 3 loads one group of its " + std::to_string(total) + " parameters",
                         rank);
  const auto& index = sd.param_groups.front().params;
  StateDict local;
  StateDict::Group group;
  group.hyperparams = sd.param_groups.front().hyperparams;
  std::size_t pos = 0;
  for (std::size_t u = 0; u < im.units.size(); ++u) {
    const Unit& unit = im.units[u];
    group.params.push_back(static_cast<std::int64_t>(u));
    std::vector<const ParamState*> states;
    for (std::size_t i = 0; i < unit.shapes.size(); ++i, ++pos) {
      const auto it = sd.state.find(index[pos]);
      states.push_back(it == sd.state.end() ? nullptr : &it->second);
    }
    const std::size_t with = static_cast<std::size_t>(std::count_if(states.begin(), states.end(),
                                                                    [](const ParamState* s) { return s != nullptr; }));
    if (with == 0) continue;
    const std::string where = "unit " + std::to_string(u);
    if (with != states.size())
      throw StateDictError(op, where + ": some of its parameters have state and some have none", rank);
    ParamState shard_state;
    for (const auto& [key, first] : *states.front()) {
      std::vector<Tensor> per_param;
      for (std::size_t i = 0; i < states.size(); ++i) {
        const auto k = states[i]->find(key);
        if (k == states[i]->end() || !k->second.defined())
          throw StateDictError(op, where + " parameter " + std::to_string(i) + " has no state '" + key + "'", rank);
        per_param.push_back(k->second);
      }
      if (first.dim() == 0) {
        shard_state[key] = first.clone();
        continue;
      }
      for (std::size_t i = 0; i < per_param.size(); ++i)
        if (per_param[i].shape() != unit.shapes[i])
          throw StateDictError(op, where + " parameter " + std::to_string(i) + " state '" + key + "' has shape " +
                                       shape_str(per_param[i].shape()) + ", the parameter " +
                                       shape_str(unit.shapes[i]), rank);
      Tensor part = Tensor::empty({unit.shard_numel}, first.dtype());
      copy_own_part(unit, rank, per_param, part);
      shard_state[key] = std::move(part);
    }
    local.state[static_cast<std::int64_t>(u)] = std::move(shard_state);
  }
  local.param_groups.push_back(std::move(group));
  im.optim->load_state_dict(local);
}

std::vector<Tensor> ShardedUnits::full_parameters() {
  Impl& im = *impl_;
  std::vector<Tensor> out;
  for (const auto& unit : im.units) {
    Tensor all = Tensor::empty({unit.shard_numel * im.world()});
    im.group.all_gather_into_tensor(all, unit.shard);
    for (auto& v : Impl::views(unit, all)) out.push_back(std::move(v));
  }
  return out;
}

void ShardedUnits::load_parameters(const std::vector<Tensor>& full) {
  static constexpr const char* op = "ShardedUnits.load_parameters";
  Impl& im = *impl_;
  std::size_t pos = 0;
  for (const auto& unit : im.units)
    for (std::size_t i = 0; i < unit.shapes.size(); ++i, ++pos)
      if (pos >= full.size() || !full[pos].defined() || full[pos].shape() != unit.shapes[i])
        throw ShapeError(op, "parameter " + std::to_string(pos) + " is missing, undefined or not of shape " +
                                 shape_str(unit.shapes[i]), im.rank());
  if (pos != full.size())
    throw ShapeError(op, std::to_string(full.size()) + " tensors for " + std::to_string(pos) + " parameters",
                     im.rank());
  for (std::size_t u = 0; u < im.units.size(); ++u) release(u);  // gathers in flight read the shards
  pos = 0;
  for (const auto& unit : im.units) {
    const std::vector<Tensor> mine(full.begin() + static_cast<std::ptrdiff_t>(pos),
                                   full.begin() + static_cast<std::ptrdiff_t>(pos + unit.shapes.size()));
    copy_own_part(unit, im.rank(), mine, unit.shard);
    pos += unit.shapes.size();
  }
}

}  // namespace dopt::optim
