// ZeroParams (zero_params.hpp) and Repoint (zero_repoint.hpp): the
// parameters of a ZeroRedundancyOptimizer, their checks, and moving them
// onto memory ZeRO owns.
#include "zero_params.hpp"

#include <cmath>
#include <typeinfo>
#include <unordered_map>

#include "dopt/optim/internal/param_checks.hpp"
#include "survive/agreement.hpp"
#include "zero_internal.hpp"
#include "zero_repoint.hpp"

namespace dopt::optim::zero_detail {

void ZeroParams::add(OptimizerParamGroup group, const char* op, int rank) {
  std::unordered_map<const TensorImpl*, std::size_t> in_group;
  std::vector<Tensor> unique;
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    if (!p.defined())
      throw TypeError(op, "parameter " + std::to_string(i) + " of the group is an undefined tensor", rank);
    if (!is_floating_point(p.dtype()))
      throw TypeError(op, "can only optimize floating-point tensors, but parameter " + std::to_string(i) + " is " +
                              std::string(dtype_name(p.dtype())), rank);
    if (!all_.empty() && p.device().type != all_.front().device().type)
      throw ValueError(op, "all parameters must be on the same device type, but got both " +
                               all_.front().device().str() + " and " + p.device().str(), rank);
    if (!unique.empty() && p.device().type != unique.front().device().type)
      throw ValueError(op, "all parameters must be on the same device type, but got both " +
                               unique.front().device().str() + " and " + p.device().str(), rank);
    if (index_of_.count(p.key()))
      throw ValueError(op, "some parameters appear in more than one parameter group", rank);
    if (auto [it, fresh] = in_group.emplace(p.key(), i); !fresh)
      throw ValueError(op, ::dopt::optim::detail::duplicate_param_text(i, it->second, p), rank);
    unique.push_back(p);
  }
  group.params = std::move(unique);
  if (!group.options) group.options = defaults_->clone();
  else if (typeid(*group.options) != typeid(*defaults_))
    throw TypeError(op, "the group's options are not " + optimizer_ + "'s options type", rank);
  group.options->validate(op);
  for (const auto& p : group.params) group.options->check_param(p, op);
  for (const auto& p : group.params) {
    index_of_.emplace(p.key(), static_cast<std::int64_t>(all_.size()));
    all_.push_back(p);
  }
  groups_.push_back(std::move(group));
}

void ZeroParams::truncate(std::size_t groups, std::size_t params) {
  for (std::size_t i = params; i < all_.size(); ++i) index_of_.erase(all_[i].key());
  if (all_.size() > params) all_.resize(params);
  while (groups_.size() > groups) groups_.pop_back();
}

void ZeroParams::check_same_everywhere(ProcessGroup g, ZeroPartitionWeight weight, const char* op,
                                       int rank) const {
  // A hash of the structure: groups, sizes, dtypes, shapes.
  ::dopt::optim::detail::StructureHash h;
  std::int64_t numel = 0;
  h.mix(groups_.size());
  h.mix(static_cast<std::uint64_t>(weight));
  for (const auto& grp : groups_) {
    h.mix(grp.params.size());
    for (const auto& p : grp.params) {
      h.mix(static_cast<std::uint64_t>(p.dtype()));
      h.mix(static_cast<std::uint64_t>(p.dim()));
      for (auto d : p.shape()) h.mix(static_cast<std::uint64_t>(d));
      numel += p.numel();
    }
  }
  const std::vector<std::int64_t> mine{h.value(), static_cast<std::int64_t>(groups_.size()),
                                       static_cast<std::int64_t>(all_.size()), numel};
  // First whether all agree: the greatest of every word and of its
  // complement (the least), one all_reduce of 8 words: O(1) per rank, not
  // the world's descriptors on every rank. Only on a disagreement (every
  // rank sees it) are they gathered, to name the first rank that differs.
  std::vector<std::int64_t> bounds(mine);
  for (const auto v : mine) bounds.push_back(~v);
  Tensor reduced = Tensor::from_vector(bounds);
  g.all_reduce(reduced, ReduceOp::max);
  const auto bound = reduced.to_vector<std::int64_t>();
  bool agree = true;
  for (std::size_t i = 0; i < mine.size(); ++i) agree = agree && bound[i] == ~bound[mine.size() + i];
  if (agree) return;
  const auto all = ::dopt::optim::detail::all_gather_descriptors(g, mine);
  auto describe = [](const std::vector<std::int64_t>& d) {
    return std::to_string(d[1]) + " groups, " + std::to_string(d[2]) + " parameters, " + std::to_string(d[3]) +
           " elements, structure hash " + std::to_string(d[0]);
  };
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (!all.same(r, 0))
      throw ValueError(op,
                       "the parameter lists differ across ranks: rank 0 has " + describe(all[0]) + ", rank " +
                           std::to_string(r) + " has " + describe(all[r]) +
                           " (every rank must pass the same parameter groups, in the same order, with the same "
                           "shapes and dtypes)",
                       rank);
  }
}

std::int64_t ZeroParams::index(const Tensor& p) const {
  auto it = index_of_.find(p.key());
  return it == index_of_.end() ? -1 : it->second;
}

std::vector<std::size_t> ZeroParams::group_of_each() const {
  std::vector<std::size_t> out;
  for (std::size_t g = 0; g < groups_.size(); ++g) out.insert(out.end(), groups_[g].params.size(), g);
  return out;
}

std::vector<bool> ZeroParams::trainable_mask() const {
  std::vector<bool> m;
  m.reserve(all_.size());
  for (const auto& p : all_) m.push_back(p.requires_grad());
  return m;
}

std::vector<double> ZeroParams::weights(ZeroPartitionWeight w) const {
  std::vector<double> out(all_.size(), 0.0);
  for (const auto& g : groups_)
    for (const auto& p : g.params) {
      const auto i = static_cast<std::size_t>(index_of_.at(p.key()));
      out[i] = w == ZeroPartitionWeight::step_cost ? std::floor(g.options->step_cost(p.shape()))
                                                   : static_cast<double>(p.numel());
    }
  return out;
}

std::string ZeroParams::describe_all() const {
  std::string shapes;
  for (std::size_t i = 0; i < all_.size(); ++i) shapes += (i ? ";" : "") + param_descr(all_[i]);
  return shapes;
}

// --- Repoint -------------------------------------------------------------------

void Repoint::check(const std::vector<Tensor>& params, const ZeroParams& all, const char* op, const char* why,
                    int rank) const {
  if (rebind_) return;
  for (const auto& p : params) {
    const auto& st = p.storage();
    const bool foreign = !st->owned();
    if (!foreign && st.use_count() == 1) continue;
    const std::int64_t index = all.index(p);
    throw ValueError(op,
                     std::string("parameter ") + std::to_string(index) + " (" + param_descr(p) + ") " +
                         (foreign ? "is a view of memory dopt does not own (Tensor::from_blob / from_dlpack)"
                                  : "shares its memory with another tensor (e.g. it is a view of a larger buffer)") +
                         ", and " + why + " that ZeRO owns: the caller's tensor over the old memory would stop "
                         "seeing the updates. Set ZeroOptions::rebind_parameter to a hook that makes the caller's "
                         "tensor a view of the parameter's new memory (as torch's `p.data = bucket_view`), or "
                         "pass parameters with memory of their own",
                     rank);
  }
}

void Repoint::operator()(const Tensor& p, const Tensor& to) const {
  p.set_data(to);
  if (rebind_) rebind_(p);
}

}  // namespace dopt::optim::zero_detail
