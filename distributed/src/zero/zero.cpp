// ZeroRedundancyOptimizer: construction, the checks of its parameters, and
// add_param_group (contract in zero.hpp, design in docs/zero.md). The rest is
// in zero_partition.cpp, zero_step.cpp, zero_state_dict.cpp, zero_join.cpp,
// zero_redundancy.cpp, zero_replay.cpp and zero_overlap.cpp.
#include "dopt/distributed/zero.hpp"

#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include "survive/agreement.hpp"
#include "dopt/optim/internal/param_checks.hpp"
#include "zero_host_memory.hpp"
#include "zero_internal.hpp"
#include "zero_overlap_internal.hpp"

namespace dopt::optim {
namespace {

using zero_detail::kName;
using zero_detail::param_descr;

std::vector<OptimizerParamGroup> one_group(std::vector<Tensor> params) {
  if (params.empty()) throw ValueError(kName, "ZeroRedundancyOptimizer got an empty parameter list");
  std::vector<OptimizerParamGroup> g;
  g.emplace_back(std::move(params));
  return g;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerSpec spec, ZeroOptions options)
    : ZeroRedundancyOptimizer(one_group(std::move(params)), std::move(spec), std::move(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> groups, OptimizerSpec spec,
                                                 ZeroOptions options)
    : spec_(std::move(spec)), group_(std::move(options.process_group)),
      bucket_view_(options.parameters_as_bucket_view), partition_weight_(options.partition_weight),
      rebind_(std::move(options.rebind_parameter)), redundancy_(options.redundancy),
      on_membership_change_(std::move(options.on_membership_change)), probe_(std::move(options.probe)),
      buddy_update_(options.buddy_update), snapshot_interval_(options.snapshot_interval) {
  if (!group_.valid() || !group_.is_member())
    throw ValueError(kName, "a valid process group this rank is a member of is required");
  rank_ = group_.rank();
  world_size_ = group_.size();
  if (redundancy_ < 0)
    throw ValueError(kName, "redundancy must be >= 0, got " + std::to_string(redundancy_), rank_);
  if (snapshot_interval_ < 1)
    throw ValueError(kName, "snapshot_interval must be >= 1, got " + std::to_string(snapshot_interval_), rank_);
  if (redundancy_ > 0 && options.overlap_with_ddp)
    throw NotSupportedError(kName, "redundancy is not available with overlap_with_ddp=true", rank_);
  defaults_ = make_options(spec_);
  if (groups.empty()) throw ValueError(kName, "ZeroRedundancyOptimizer got an empty parameter list");
  for (auto& g : groups) add_group_checked(std::move(g), kName);
  if (all_params_.empty()) throw ValueError(kName, "ZeroRedundancyOptimizer got an empty parameter list");
  if (options.overlap_with_ddp)
    check_repointable(all_params_, kName, "overlap_with_ddp makes each reducer bucket's parameters views of one flat buffer");
  else if (bucket_view_)
    check_repointable(all_params_, kName, "parameters_as_bucket_view makes the parameters views of one flat buffer per rank");
  std::unique_ptr<FunctionalOptimizer> functional;
  if (options.overlap_with_ddp) {
    bucket_view_ = false;  // torch: ignored with overlap (each reducer bucket is one flat buffer)
    try {
      functional = make_functional(OptimizerSpec{spec_.name, groups_.front().options->to_hyperparams()}, {},
                                   /*allow_empty_param_list=*/true);
    } catch (const ValueError&) {
      throw ValueError(kName, "Using `overlap_with_ddp=true` requires using a functional optimizer, but there is "
                              "no supported functional optimizer equivalent for " + spec_.name, rank_);
    }
    const ProcessGroup& bg = options.overlap_broadcast_group;
    if (bg.valid() && (!bg.is_member() || bg.ranks() != group_.ranks()))
      throw ValueError(kName, "overlap_broadcast_group must have the ranks of process_group", rank_);
  }
  check_same_params_everywhere(kName);
  if (options.overlap_with_ddp) {
    ProcessGroup bgroup = options.overlap_broadcast_group;
    if (!bgroup.valid()) {
      try {
        bgroup = group_.new_group(group_.ranks());
      } catch (const StateError&) {
        throw ValueError(kName, "overlap_with_ddp on a process group other than the world needs "
                                "ZeroOptions::overlap_broadcast_group (a second group over the same ranks, "
                                "made with world.new_group(ranks))", rank_);
      }
    }
    // No partition until the plan (hook_with_zero_step*): empty local groups.
    partition_.assign(static_cast<std::size_t>(world_size_), std::vector<std::vector<Tensor>>(groups_.size()));
    owner_.assign(all_params_.size(), -1);
    optim_ = make_optimizer(spec_, local_groups(0));
    trainable_ = trainable_mask();
    overlap_ = std::make_shared<ZeroOverlap>(*this, std::move(bgroup), std::move(functional));
    return;
  }
  if (host_memory()) check_host_memory(options.host_memory_chunk);
  partition_parameters();
  optim_ = make_optimizer(spec_, local_groups(0));
  if (redundancy_ > 0) {
    init_hosts(options.hosts);
    make_buddy_copies();
  }
  trainable_ = trainable_mask();
  if (host_memory()) {
    share_keeps_anew();
  } else if (bucket_view_) {
    build_buckets();
  }
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, const OptimizerOptions& optimizer,
                                                 ZeroOptions options)
    : ZeroRedundancyOptimizer(std::move(params), spec_of(optimizer, kName), std::move(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> groups,
                                                 const OptimizerOptions& optimizer, ZeroOptions options)
    : ZeroRedundancyOptimizer(std::move(groups), spec_of(optimizer, kName), std::move(options)) {}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  overlap_.reset();  // stops the worker before anything it uses goes
}

void ZeroRedundancyOptimizer::require_overlap_idle(const std::string& op) const {
  if (overlap_) overlap_->require_idle(op);
}

std::vector<int> ZeroRedundancyOptimizer::overlap_bucket_owners() const {
  return overlap_ ? overlap_->bucket_owners() : std::vector<int>{};
}

void ZeroRedundancyOptimizer::check_repointable(const std::vector<Tensor>& params, const char* op,
                                                const char* why) const {
  if (rebind_) return;
  for (const auto& p : params) {
    const auto& st = p.storage();
    const bool foreign = !st->owned();
    if (!foreign && st.use_count() == 1) continue;
    const std::int64_t index = global_index(p);
    throw ValueError(op,
                     std::string("parameter ") + std::to_string(index) + " (" + param_descr(p) + ") " +
                         (foreign ? "is a view of memory dopt does not own (Tensor::from_blob / from_dlpack)"
                                  : "shares its memory with another tensor (e.g. it is a view of a larger buffer)") +
                         ", and " + why + " that ZeRO owns: the caller's tensor over the old memory would stop "
                         "seeing the updates. Set ZeroOptions::rebind_parameter to a hook that makes the caller's "
                         "tensor a view of the parameter's new memory (as torch's `p.data = bucket_view`), or "
                         "pass parameters with memory of their own",
                     rank_);
  }
}

void ZeroRedundancyOptimizer::repoint(const Tensor& p, const Tensor& to) const {
  p.set_data(to);
  if (rebind_) rebind_(p);
}

void ZeroRedundancyOptimizer::add_group_checked(OptimizerParamGroup group, const char* op) {
  std::unordered_map<const TensorImpl*, std::size_t> in_group;
  std::vector<Tensor> unique;
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    if (!p.defined())
      throw TypeError(op, "parameter " + std::to_string(i) + " of the group is an undefined tensor", rank_);
    if (!is_floating_point(p.dtype()))
      throw TypeError(op, "can only optimize floating-point tensors, but parameter " + std::to_string(i) + " is " +
                              std::string(dtype_name(p.dtype())), rank_);
    if (!all_params_.empty() && p.device().type != all_params_.front().device().type)
      throw ValueError(op, "all parameters must be on the same device type, but got both " +
                               all_params_.front().device().str() + " and " + p.device().str(), rank_);
    if (!unique.empty() && p.device().type != unique.front().device().type)
      throw ValueError(op, "all parameters must be on the same device type, but got both " +
                               unique.front().device().str() + " and " + p.device().str(), rank_);
    if (index_of_.count(p.key()))
      throw ValueError(op, "some parameters appear in more than one parameter group", rank_);
    if (auto [it, fresh] = in_group.emplace(p.key(), i); !fresh)
      throw ValueError(op, detail::duplicate_param_text(i, it->second, p), rank_);
    unique.push_back(p);
  }
  group.params = std::move(unique);
  if (!group.options) group.options = defaults_->clone();
  else if (typeid(*group.options) != typeid(*defaults_))
    throw TypeError(op, "the group's options are not " + spec_.name + "'s options type", rank_);
  group.options->validate(op);
  for (const auto& p : group.params) group.options->check_param(p, op);
  for (const auto& p : group.params) {
    index_of_.emplace(p.key(), static_cast<std::int64_t>(all_params_.size()));
    all_params_.push_back(p);
  }
  groups_.push_back(std::move(group));
}

void ZeroRedundancyOptimizer::check_same_params_everywhere(const char* op) {
  // A hash of the structure: groups, sizes, dtypes, shapes.
  detail::StructureHash h;
  std::int64_t numel = 0;
  h.mix(groups_.size());
  h.mix(static_cast<std::uint64_t>(partition_weight_));
  for (const auto& g : groups_) {
    h.mix(g.params.size());
    for (const auto& p : g.params) {
      h.mix(static_cast<std::uint64_t>(p.dtype()));
      h.mix(static_cast<std::uint64_t>(p.dim()));
      for (auto d : p.shape()) h.mix(static_cast<std::uint64_t>(d));
      numel += p.numel();
    }
  }
  const auto all = detail::all_gather_descriptors(
      group_, {h.value(), static_cast<std::int64_t>(groups_.size()), static_cast<std::int64_t>(all_params_.size()), numel});
  auto describe = [](const std::vector<std::int64_t>& d) {
    return std::to_string(d[1]) + " groups, " + std::to_string(d[2]) + " parameters, " + std::to_string(d[3]) +
           " elements, structure hash " + std::to_string(d[0]);
  };
  const auto& ref = all[0];
  for (int r = 1; r < world_size_; ++r) {
    const auto& other = all[static_cast<std::size_t>(r)];
    if (other != ref)
      throw ValueError(op,
                       "the parameter lists differ across ranks: rank 0 has " + describe(ref) + ", rank " +
                           std::to_string(r) + " has " + describe(other) +
                           " (every rank must pass the same parameter groups, in the same order, with the same "
                           "shapes and dtypes)",
                       rank_);
  }
}

void ZeroRedundancyOptimizer::add_param_group(OptimizerParamGroup group) {
  const std::string op = std::string(kName) + ".add_param_group";
  if (overlap_)
    throw NotSupportedError(op, "ZeroRedundancyOptimizer with overlap_with_ddp=true cannot add parameter groups "
                                "(the reducer's buckets are fixed); pass every group to the constructor", rank_);
  if (redundancy_ > 0)
    throw NotSupportedError(op, "ZeroRedundancyOptimizer with redundancy cannot add parameter groups; pass every "
                                "group to the constructor", rank_);
  // Validate into a scratch copy of the bookkeeping first, so a failure
  // (local or the cross-rank check) leaves the optimizer unchanged.
  const auto saved_groups_size = groups_.size();
  const auto saved_params_size = all_params_.size();
  try {
    add_group_checked(std::move(group), op.c_str());
    if (bucket_view_)
      check_repointable(std::vector<Tensor>(all_params_.begin() + static_cast<std::ptrdiff_t>(saved_params_size),
                                            all_params_.end()),
                        op.c_str(), "parameters_as_bucket_view makes the parameters views of one flat buffer per rank");
    check_same_params_everywhere(op.c_str());
  } catch (...) {
    for (std::size_t i = saved_params_size; i < all_params_.size(); ++i) index_of_.erase(all_params_[i].key());
    all_params_.resize(saved_params_size);
    while (groups_.size() > saved_groups_size) groups_.pop_back();
    throw;
  }
  partition_parameters();
  sync_to_local();
  for (auto& g : local_groups(groups_.size() - 1)) optim_->add_param_group(std::move(g));
  trainable_ = trainable_mask();
  if (bucket_view_) build_buckets();
}

std::vector<int> ZeroRedundancyOptimizer::param_owners() const { return owner_; }

std::int64_t ZeroRedundancyOptimizer::global_index(const Tensor& p) const {
  auto it = index_of_.find(p.key());
  return it == index_of_.end() ? -1 : it->second;
}

std::int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  std::int64_t b = 0;
  for (const auto& [k, st] : optim_->state())
    for (const auto& [name, t] : st)
      if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  return b;
}

}  // namespace dopt::optim
