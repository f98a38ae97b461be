#include "dopt/optim/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <typeinfo>
#include <unordered_set>

#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "dopt/optim/state_check.hpp"
#include "agreement.hpp"
#include "zero_overlap_internal.hpp"

namespace dopt::optim {
namespace {

constexpr const char* kName = "ZeroRedundancyOptimizer";
namespace fs = std::filesystem;

std::vector<OptimizerParamGroup> one_group(std::vector<Tensor> params) {
  if (params.empty()) throw ValueError(kName, "ZeroRedundancyOptimizer got an empty parameter list");
  std::vector<OptimizerParamGroup> g;
  g.emplace_back(std::move(params));
  return g;
}

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

std::string param_descr(const Tensor& p) {
  return std::string(dtype_name(p.dtype())) + shape_str(p.shape());
}

/// Copy of a loaded state entry for parameter p: `step` as is, other tensors
/// cast to p's dtype on p's device (shape checked); 0-d tensors on the CPU.
/// `source(key)` names a state tensor in errors (the file and entry, or the
/// parameter index).
ParamState copy_state_for(const ParamState& st, const Tensor& p, std::int64_t index, const std::string& op,
                          const std::function<std::string(const std::string&)>& source) {
  ParamState out;
  for (const auto& [key, value] : st) {
    if (!value.defined()) continue;
    check_state_value(op, source(key), key, value);
    if (key == "step") {
      out[key] = value.to(Device::cpu());
      continue;
    }
    if (value.dim() != 0 && value.shape() != p.shape())
      throw StateDictError(op, "state '" + key + "' of parameter " + std::to_string(index) + " has shape " +
                                   shape_str(value.shape()) + " but the parameter has shape " +
                                   shape_str(p.shape()));
    const Device d = value.dim() == 0 ? Device::cpu() : p.device();
    Tensor t = Tensor::empty(value.shape(), p.dtype(), d);
    t.copy_(value);
    out[key] = std::move(t);
  }
  return out;
}

class ZeroJoinHook : public JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizer& z) : zero_(z) {}
  // With overlap the reducer's shadow iteration drives ZeRO through the comm hook.
  void main_hook() override {
    if (!zero_.overlap_with_ddp()) zero_.step();
  }

 private:
  ZeroRedundancyOptimizer& zero_;
};

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerSpec spec, ZeroOptions options)
    : ZeroRedundancyOptimizer(one_group(std::move(params)), std::move(spec), std::move(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> groups, OptimizerSpec spec,
                                                 ZeroOptions options)
    : spec_(std::move(spec)), group_(std::move(options.process_group)),
      bucket_view_(options.parameters_as_bucket_view), partition_weight_(options.partition_weight),
      rebind_(std::move(options.rebind_parameter)), redundancy_(options.redundancy),
      on_membership_change_(std::move(options.on_membership_change)), probe_(std::move(options.probe)) {
  if (!group_.valid() || !group_.is_member())
    throw ValueError(kName, "a valid process group this rank is a member of is required");
  rank_ = group_.rank();
  world_size_ = group_.size();
  if (redundancy_ < 0)
    throw ValueError(kName, "redundancy must be >= 0, got " + std::to_string(redundancy_), rank_);
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
  partition_parameters();
  optim_ = make_optimizer(spec_, local_groups(0));
  if (redundancy_ > 0) make_buddy_copies();
  trainable_ = trainable_mask();
  if (bucket_view_) build_buckets();
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
  std::unordered_set<const TensorImpl*> in_group;
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
    if (in_group.insert(p.key()).second) unique.push_back(p);
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

void ZeroRedundancyOptimizer::partition_parameters() {
  const std::size_t ng = groups_.size();
  partition_.assign(static_cast<std::size_t>(world_size_), std::vector<std::vector<Tensor>>(ng));
  owner_.assign(all_params_.size(), -1);
  // Weights are whole numbers far below 2^53 (elements, or multiply-adds),
  // so the double sums are exact and every rank gets the same partition.
  const std::vector<double> weight = partition_weights();
  std::vector<double> sizes(static_cast<std::size_t>(world_size_), 0.0);
  for (std::size_t g = 0; g < ng; ++g) {
    std::vector<Tensor> sorted = groups_[g].params;
    auto w = [&](const Tensor& p) { return weight[static_cast<std::size_t>(index_of_.at(p.key()))]; };
    std::stable_sort(sorted.begin(), sorted.end(), [&](const Tensor& a, const Tensor& b) { return w(a) > w(b); });
    for (const auto& p : sorted) {
      std::size_t r = 0;
      for (std::size_t k = 1; k < sizes.size(); ++k)
        if (sizes[k] < sizes[r]) r = k;
      partition_[r][g].push_back(p);
      sizes[r] += w(p);
      owner_[static_cast<std::size_t>(index_of_.at(p.key()))] = static_cast<int>(r);
    }
  }
}

std::vector<double> ZeroRedundancyOptimizer::partition_weights() const {
  std::vector<double> out(all_params_.size(), 0.0);
  for (const auto& g : groups_)
    for (const auto& p : g.params) {
      const auto i = static_cast<std::size_t>(index_of_.at(p.key()));
      out[i] = partition_weight_ == ZeroPartitionWeight::step_cost ? std::floor(g.options->step_cost(p.shape()))
                                                                    : static_cast<double>(p.numel());
    }
  return out;
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizer::local_groups(std::size_t first_group) const {
  std::vector<OptimizerParamGroup> out;
  for (std::size_t g = first_group; g < groups_.size(); ++g)
    out.emplace_back(partition_[static_cast<std::size_t>(rank_)][g], groups_[g].options->clone());
  return out;
}

std::vector<bool> ZeroRedundancyOptimizer::trainable_mask() const {
  std::vector<bool> m;
  m.reserve(all_params_.size());
  for (const auto& p : all_params_) m.push_back(p.requires_grad());
  return m;
}

void ZeroRedundancyOptimizer::build_buckets() {
  // Kinds (device, dtype) in order of first appearance over ranks, groups, params.
  std::vector<std::pair<Device, DType>> kinds;
  auto kind_of = [&](const Tensor& p) -> std::size_t {
    for (std::size_t k = 0; k < kinds.size(); ++k)
      if (kinds[k].first == p.device() && kinds[k].second == p.dtype()) return k;
    kinds.emplace_back(p.device(), p.dtype());
    return kinds.size() - 1;
  };
  std::vector<std::vector<std::vector<Tensor>>> per(static_cast<std::size_t>(world_size_));  // [rank][kind]
  for (std::size_t r = 0; r < per.size(); ++r)
    for (const auto& g : partition_[r])
      for (const auto& p : g) {
        const std::size_t k = kind_of(p);
        if (per[r].size() <= k) per[r].resize(k + 1);
        per[r][k].push_back(p);
      }
  buckets_.assign(kinds.size(), std::vector<Tensor>(static_cast<std::size_t>(world_size_)));
  for (std::size_t r = 0; r < per.size(); ++r) {
    per[r].resize(kinds.size());
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      std::int64_t total = 0;
      for (const auto& p : per[r][k]) {
        if (p.requires_grad()) total += p.numel();
        else repoint(p, p.clone());  // frozen: own storage, outside any bucket
      }
      if (total == 0) {
        buckets_[k][r] = Tensor::zeros({1}, kinds[k].second, kinds[k].first);
        continue;
      }
      Tensor bucket = Tensor::empty({total}, kinds[k].second, kinds[k].first);
      std::int64_t off = 0;
      for (const auto& p : per[r][k]) {
        if (!p.requires_grad()) continue;
        const std::int64_t n = p.numel();
        Tensor slice = bucket.flat_slice(off, n);
        slice.copy_(p);
        repoint(p, slice.view(p.shape()));
        off += n;
      }
      buckets_[k][r] = std::move(bucket);
    }
  }
}

void ZeroRedundancyOptimizer::sync_to_local() {
  auto& local = optim_->param_groups();
  for (std::size_t g = 0; g < groups_.size() && g < local.size(); ++g)
    local[g].options = groups_[g].options->clone();
}

void ZeroRedundancyOptimizer::sync_from_local() {
  const auto& local = optim_->param_groups();
  for (std::size_t g = 0; g < groups_.size() && g < local.size(); ++g)
    groups_[g].options = local[g].options->clone();
}

void ZeroRedundancyOptimizer::sync_params() {
  std::vector<Future<void>> works;
  std::exception_ptr first;
  auto post = [&](Future<void> f) {
    works.push_back(std::move(f));
    if (probe_) probe_("broadcast", steps_, static_cast<int>(works.size()) - 1);
  };
  try {
    for (int r = 0; r < world_size_; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (bucket_view_) {
        for (auto& kind : buckets_) post(group_.broadcast_async(kind[ur], r));
        continue;
      }
      // One call for all of rank r's parameters (on the shared-memory plane
      // without a flat copy); device tensors go one by one to their backend.
      std::vector<Tensor> mine;
      bool cpu = true;
      for (const auto& g : partition_[ur])
        for (const auto& p : g) {
          mine.push_back(p);
          cpu = cpu && p.device().is_cpu();
        }
      if (cpu) {
        if (!mine.empty()) post(group_.broadcast_coalesced_async(mine, r));
      } else {
        for (const auto& p : mine) post(group_.broadcast_async(p, r));
      }
    }
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& w : works) wait_keeping_first_error(w, first);
  if (first) std::rethrow_exception(first);
}

std::optional<double> ZeroRedundancyOptimizer::step(const Optimizer::LossClosure& closure) {
  if (overlap_) {
    if (closure)
      throw ValueError(std::string(kName) + ".step",
                       "a closure cannot be used with overlap_with_ddp=true (the steps run in the comm hook)",
                       rank_);
    overlap_->wait_step();
    return std::nullopt;
  }
  if (redundancy_ > 0 && closure)
    throw ValueError(std::string(kName) + ".step",
                     "a closure cannot be used with redundancy (the buddies step their copies with the gradients "
                     "step() is called with)", rank_);
  Future<void> notify = Join::notify_join_context(*this);
  const auto mask = trainable_mask();
  if (mask != trainable_) {
    if (bucket_view_) {
      notice(std::string(kName) + " [rank " + std::to_string(rank_) +
             "]: the trainable parameters changed; rebuilding the parameter buckets");
      build_buckets();
    }
    trainable_ = mask;
  }
  if (probe_) probe_("begin", steps_, 0);
  sync_to_local();
  std::optional<double> loss = optim_->step(closure);
  if (redundancy_ > 0) step_buddy_copies();
  sync_from_local();
  if (probe_) probe_("computed", steps_, 0);
  if (redundancy_ == 0) {
    sync_params();
    notify.get();
    ++steps_;
    return loss;
  }
  ZeroRecovery rec;
  try {
    sync_params();
    notify.get();
    ++steps_;
    return loss;
  } catch (const PeerLostError&) {
    rec = recover_from_loss(/*in_step=*/true);
  }
  if (!on_membership_change_)
    throw MembershipChangedError(std::string(kName) + ".step",
                                 "recovered from the loss of rank(s) of the group; the step was completed, " +
                                     std::to_string(rec.group.size()) + " rank(s) continue",
                                 rec, rank_);
  on_membership_change_(rec);
  return loss;
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (const auto& p : all_params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else g.zero_();
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

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const std::string op = std::string(kName) + ".consolidate_state_dict";
  require_overlap_idle(op);
  if (to < 0 || to >= world_size_)
    throw ValueError(op, "to=" + std::to_string(to) + " is not a rank of the group (size " +
                             std::to_string(world_size_) + ")", rank_);
  sync_to_local();
  all_state_dicts_.clear();
  auto cpu_copy = [](StateDict sd) {
    for (auto& [id, st] : sd.state)
      for (auto& [k, t] : st)
        if (t.defined()) t = t.device().is_cpu() ? t.clone() : t.to(Device::cpu());
    return sd;
  };
  std::vector<StateDict> gathered;
  for (int r = 0; r < world_size_; ++r) {
    if (r == to) {
      if (rank_ == to) gathered.push_back(cpu_copy(optim_->state_dict()));
      continue;
    }
    // Object broadcast from r: int64 length, then the safetensors bytes.
    Tensor len = Tensor::zeros({1}, DType::int64);
    std::string bytes;
    if (rank_ == r) {
      const SafetensorsFile f = state_dict_to_safetensors(optim_->state_dict());
      bytes = serialize_safetensors(f.tensors, f.metadata);
      len.data<std::int64_t>()[0] = static_cast<std::int64_t>(bytes.size());
    }
    group_.broadcast(len, r);
    const std::int64_t n = len.data<std::int64_t>()[0];
    Tensor payload = Tensor::empty({n}, DType::uint8);
    if (rank_ == r && n > 0) std::memcpy(payload.data_ptr(), bytes.data(), bytes.size());
    group_.broadcast(payload, r);
    if (rank_ == to) {
      const std::string what = "consolidated state of rank " + std::to_string(r);
      gathered.push_back(state_dict_from_safetensors(
          parse_safetensors(payload.data_ptr(), static_cast<std::size_t>(n), what), what));
    }
  }
  all_state_dicts_ = std::move(gathered);
}

StateDict ZeroRedundancyOptimizer::state_dict() const {
  require_overlap_idle(std::string(kName) + ".state_dict");
  if (all_state_dicts_.empty())
    throw StateError(std::string(kName) + ".state_dict",
                     "Optimizer state has not been consolidated on this rank. Please call "
                     "`consolidate_state_dict(to=" +
                         std::to_string(rank_) +
                         ")` on all ranks beforehand if you meant to save the global state.",
                     rank_);
  StateDict out;
  for (const auto& g : groups_) {
    StateDict::Group og;
    og.hyperparams = g.options->to_hyperparams();
    for (const auto& p : g.params) og.params.push_back(index_of_.at(p.key()));
    out.param_groups.push_back(std::move(og));
  }
  for (std::size_t r = 0; r < all_state_dicts_.size(); ++r) {
    const StateDict& local = all_state_dicts_[r];
    const auto& part = partition_[r];
    for (std::size_t g = 0; g < local.param_groups.size() && g < part.size(); ++g) {
      const auto& ids = local.param_groups[g].params;
      for (std::size_t k = 0; k < ids.size() && k < part[g].size(); ++k) {
        auto it = local.state.find(ids[k]);
        if (it != local.state.end()) out.state[index_of_.at(part[g][k].key())] = it->second;
      }
    }
  }
  return out;
}

void ZeroRedundancyOptimizer::load_state_dict(const StateDict& sd) {
  const std::string op = std::string(kName) + ".load_state_dict";
  require_overlap_idle(op);
  if (sd.param_groups.size() != groups_.size())
    throw StateDictError(op, "loaded state dict has a different number of parameter groups (" +
                                 std::to_string(sd.param_groups.size()) + " vs " + std::to_string(groups_.size()) +
                                 ")", rank_);
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (sd.param_groups[g].params.size() != groups_[g].params.size())
      throw StateDictError(op, "loaded state dict contains a parameter group that doesn't match the size of "
                               "optimizer's group (group " + std::to_string(g) + ": " +
                               std::to_string(sd.param_groups[g].params.size()) + " vs " +
                               std::to_string(groups_[g].params.size()) + " parameters)", rank_);
  std::vector<std::unique_ptr<OptimizerOptions>> opts;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    auto o = groups_[g].options->clone();
    o->set_hyperparams(sd.param_groups[g].hyperparams);
    o->validate(op);
    opts.push_back(std::move(o));
  }
  std::unordered_map<const TensorImpl*, ParamState> local;
  for (const auto& [index, st] : sd.state) {
    if (index < 0 || index >= static_cast<std::int64_t>(all_params_.size()))
      throw StateDictError(op, "state for parameter index " + std::to_string(index) + " but the optimizer has " +
                                   std::to_string(all_params_.size()) + " parameters", rank_);
    if (!keeps_state_of(static_cast<std::size_t>(index))) continue;
    const Tensor& p = all_params_[static_cast<std::size_t>(index)];
    local[p.key()] = copy_state_for(st, p, index, op, [&](const std::string& key) {
      return "state '" + key + "' of parameter " + std::to_string(index);
    });
  }
  for (auto& [r, copy] : buddy_copies_) copy->state().clear();
  for (auto it = local.begin(); it != local.end();) {  // the buddies' part
    const int o = owner_[static_cast<std::size_t>(index_of_.at(it->first))];
    if (o == rank_) {
      ++it;
      continue;
    }
    buddy_copies_.at(o)->state()[it->first] = std::move(it->second);
    it = local.erase(it);
  }
  optim_->state() = std::move(local);
  for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(opts[g]);
  sync_to_local();
}

std::string ZeroRedundancyOptimizer::shard_file_name(int rank, int world_size) {
  return "optim-rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

void ZeroRedundancyOptimizer::save_sharded(const std::string& dir) const {
  const std::string op = std::string(kName) + ".save_sharded";
  require_overlap_idle(op);
  std::exception_ptr failure;
  try {
    fs::create_directories(dir);
    StateDict sd;
    const auto& mine = partition_[static_cast<std::size_t>(rank_)];
    std::vector<std::int64_t> sizes;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      StateDict::Group og;
      og.hyperparams = groups_[g].options->to_hyperparams();
      for (const auto& p : mine[g]) {
        const std::int64_t idx = index_of_.at(p.key());
        og.params.push_back(idx);
        auto it = optim_->state().find(p.key());
        if (it != optim_->state().end() && !it->second.empty()) sd.state[idx] = it->second;
      }
      sd.param_groups.push_back(std::move(og));
      sizes.push_back(static_cast<std::int64_t>(groups_[g].params.size()));
      sd.metadata["dopt.zero.group_hyperparams." + std::to_string(g)] =
          hyper_to_json(groups_[g].options->to_hyperparams());
    }
    std::vector<std::int64_t> owners(owner_.begin(), owner_.end());
    std::string shapes;
    for (std::size_t i = 0; i < all_params_.size(); ++i) shapes += (i ? ";" : "") + param_descr(all_params_[i]);
    sd.metadata["dopt.zero.format"] = kZeroShardFormat;
    sd.metadata["dopt.zero.world_size"] = std::to_string(world_size_);
    sd.metadata["dopt.zero.rank"] = std::to_string(rank_);
    sd.metadata["dopt.zero.partition"] = join_ints(owners);
    sd.metadata["dopt.zero.step"] = std::to_string(steps_);
    sd.metadata["dopt.zero.group_sizes"] = join_ints(sizes);
    sd.metadata["dopt.zero.params"] = shapes;
    sd.metadata["dopt.zero.optimizer"] = spec_.name;
    save_state_dict(sd, (fs::path(dir) / shard_file_name(rank_, world_size_)).string());
  } catch (...) {
    failure = std::current_exception();
  }
  // Every rank learns whether all shards were written (instead of a barrier,
  // so a failing rank does not leave the others waiting).
  Tensor failed = Tensor::full({1}, failure ? 1.0 : 0.0, DType::int64);
  ProcessGroup g = group_;  // a handle; the methods are not const
  g.all_reduce(failed, ReduceOp::sum);
  if (failure) std::rethrow_exception(failure);
  const auto n = failed.data<std::int64_t>()[0];
  if (n > 0)
    throw IOError(op, std::to_string(n) + " rank(s) failed to write their shard under " + dir +
                          "; the checkpoint is incomplete", rank_);
}

ShardLoadReport ZeroRedundancyOptimizer::load_sharded(const std::string& dir) {
  const std::string op = std::string(kName) + ".load_sharded";
  require_overlap_idle(op);
  if (!fs::is_directory(dir)) throw IOError(op, dir + ": not a directory", rank_);
  static const std::regex re(R"(optim-rank(\d+)-of-(\d+)\.safetensors)");
  std::map<int, std::set<int>> found;  // world size -> ranks
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) found[std::stoi(m[2].str())].insert(std::stoi(m[1].str()));
  }
  if (found.empty()) throw IOError(op, dir + ": no shard files optim-rank{r}-of-{N}.safetensors", rank_);
  if (found.size() > 1) {
    std::string sizes;
    for (const auto& [n, rs] : found) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
    throw IOError(op, dir + ": shards of several world sizes (" + sizes + "); keep one checkpoint per folder",
                  rank_);
  }
  const int n = found.begin()->first;
  for (int r = 0; r < n; ++r)
    if (!found.begin()->second.count(r))
      throw IOError(op, dir + ": missing shard " + shard_file_name(r, n), rank_);
  auto path_of = [&](int r) { return (fs::path(dir) / shard_file_name(r, n)).string(); };

  // Rank 0's header describes the checkpoint (every shard carries the same).
  std::unique_ptr<SafetensorsReader> reader0 = std::make_unique<SafetensorsReader>(path_of(0));
  const auto meta = reader0->metadata();
  auto get = [&](const std::string& key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) throw StateDictError(op, path_of(0) + ": metadata has no '" + key + "'", rank_);
    return it->second;
  };
  if (get("dopt.zero.format") != kZeroShardFormat)
    throw StateDictError(op, path_of(0) + ": format '" + get("dopt.zero.format") + "', expected '" +
                                 kZeroShardFormat + "'", rank_);
  if (get("dopt.zero.world_size") != std::to_string(n))
    throw StateDictError(op, path_of(0) + ": world size " + get("dopt.zero.world_size") +
                                 " does not match the file name", rank_);
  if (get("dopt.zero.optimizer") != spec_.name)
    throw StateDictError(op, "the checkpoint is of optimizer " + get("dopt.zero.optimizer") + ", this is " +
                                 spec_.name, rank_);
  std::string shapes;
  for (std::size_t i = 0; i < all_params_.size(); ++i) shapes += (i ? ";" : "") + param_descr(all_params_[i]);
  if (get("dopt.zero.params") != shapes)
    throw StateDictError(op, "the checkpoint's parameters (" + get("dopt.zero.params") +
                                 ") do not match this optimizer's (" + shapes + ")", rank_);
  std::vector<std::int64_t> sizes;
  for (const auto& g : groups_) sizes.push_back(static_cast<std::int64_t>(g.params.size()));
  if (split_ints(get("dopt.zero.group_sizes"), "dopt.zero.group_sizes") != sizes)
    throw StateDictError(op, "the checkpoint's group sizes (" + get("dopt.zero.group_sizes") +
                                 ") do not match this optimizer's (" + join_ints(sizes) + ")", rank_);
  const auto old_owner = split_ints(get("dopt.zero.partition"), "dopt.zero.partition");
  if (old_owner.size() != all_params_.size())
    throw StateDictError(op, "the checkpoint's partition has " + std::to_string(old_owner.size()) +
                                 " entries for " + std::to_string(all_params_.size()) + " parameters", rank_);
  std::vector<std::unique_ptr<OptimizerOptions>> opts;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    auto o = groups_[g].options->clone();
    o->set_hyperparams(hyper_from_json(get("dopt.zero.group_hyperparams." + std::to_string(g)), op.c_str()));
    o->validate(op);
    opts.push_back(std::move(o));
  }
  const std::int64_t steps = split_ints(get("dopt.zero.step"), "dopt.zero.step").at(0);

  // The shards holding this rank's parameters, ascending.
  std::set<int> needed;
  for (std::size_t i = 0; i < all_params_.size(); ++i)
    if (keeps_state_of(i)) {
      const auto o = old_owner[i];
      if (o < 0 || o >= n) throw StateDictError(op, "the checkpoint's partition names rank " + std::to_string(o), rank_);
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
                           rank_);
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
      if (idx < 0 || idx >= static_cast<std::int64_t>(all_params_.size()) ||
          old_owner[static_cast<std::size_t>(idx)] != s)
        throw StateDictError(op, rd->path() + ": tensor '" + e.name + "' is not a parameter this shard owns",
                             rank_);
      if (!keeps_state_of(static_cast<std::size_t>(idx))) continue;
      states[idx][e.name.substr(dot + 1)] = rd->read(e.name);
      ++report.tensors_read;
    }
    if (!rd->has_checksums())
      notice_once(rd->path() + " has no checksums (written by an older dopt or another program): its state is "
                               "loaded without verifying the bytes");
    for (const auto& [idx, st] : states) {
      const Tensor& p = all_params_[static_cast<std::size_t>(idx)];
      local[p.key()] = copy_state_for(st, p, idx, op, [&](const std::string& key) {
        return rd->path() + ": tensor 'state." + std::to_string(idx) + "." + key + "'";
      });
    }
  }
  for (auto& [r, copy] : buddy_copies_) copy->state().clear();
  for (auto it = local.begin(); it != local.end();) {  // the buddies' part
    const int o = owner_[static_cast<std::size_t>(index_of_.at(it->first))];
    if (o == rank_) {
      ++it;
      continue;
    }
    buddy_copies_.at(o)->state()[it->first] = std::move(it->second);
    it = local.erase(it);
  }
  optim_->state() = std::move(local);
  for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(opts[g]);
  sync_to_local();
  steps_ = steps;
  return report;
}

std::unique_ptr<JoinHook> ZeroRedundancyOptimizer::join_hook() { return std::make_unique<ZeroJoinHook>(*this); }

Device ZeroRedundancyOptimizer::join_device() const { return all_params_.front().device(); }

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
