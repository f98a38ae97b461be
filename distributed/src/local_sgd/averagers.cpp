#include "dopt/runtime/notice.hpp"
#include "dopt/distributed/averagers.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "dopt/distributed/internal/device_ops.hpp"
#include "ddp/plsgd_util.hpp"
#include "dopt/actors/internal/call_label.hpp"
#include "dopt/actors/internal/subgroups.hpp"
#include "dopt/optim/internal/write_fence.hpp"
#include "local_sgd/averager_agreement.hpp"

namespace dopt::optim {

std::vector<Tensor> get_params_to_average(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const auto& p : params) {
    check_defined(p, "get_params_to_average", "parameter");
    if (p.grad().defined()) out.push_back(p);
  }
  return out;
}

std::vector<Tensor> get_params_to_average(const std::vector<OptimizerParamGroup>& groups) {
  std::vector<Tensor> out;
  for (const auto& g : groups)
    for (const auto& p : g.params)
      if (p.defined() && p.grad().defined()) out.push_back(p);
  return out;
}

Future<void> average_parameters_async(const std::vector<Tensor>& params, ProcessGroup group) {
  static constexpr const char* op = "average_parameters";
  if (!group.valid()) throw ValueError(op, "the process group is invalid");
  dopt::detail::fence_wait();  // a background snapshot still copies the parameters
  for (const auto& p : params) {
    check_defined(p, op, "parameter");
    if (!is_floating_point(p.dtype()))
      throw TypeError(op, "can only average floating-point parameters, got " + p.str());
  }
  if (!group.is_member() || params.empty()) return make_ready_future();
  // One flat buffer per (dtype, device), in order of first appearance (on
  // the CPU: one per dtype, as before).
  std::vector<std::pair<DType, Device>> kinds;
  for (const auto& p : params) {
    const std::pair<DType, Device> k{p.dtype(), p.device()};
    if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
  }
  std::vector<Future<void>> futures;
  for (const auto& [dt, dev] : kinds) {
    std::vector<Tensor> members;
    std::int64_t total = 0;
    for (const auto& p : params)
      if (p.dtype() == dt && p.device() == dev) {
        members.push_back(p);
        total += p.numel();
      }
    if (dev.is_cpu()) {
      // torch's arithmetic (every rank's parameters divided by the world
      // size, then summed; gloo's ring order at 3+ ranks) in one pass that
      // reads and writes the parameters themselves.
      AllReduceCoalescedOptions o;
      o.op = ReduceOp::sum;
      o.order = ReduceOrder::ring;
      o.pre_divisor = group.size();
      futures.push_back(group.all_reduce_coalesced_async(members, o));
      continue;
    }
    // Device tensors: one flat buffer through the device backend (NCCL's
    // order, as torch on CUDA).
    Tensor flat = Tensor::empty({total}, dt, dev);
    std::int64_t off = 0;
    for (const auto& p : members) {
      if (p.numel()) flat.flat_slice(off, p.numel()).copy_(p);
      off += p.numel();
    }
    detail::divide_any_(flat, group.size(), op);
    futures.push_back(group.all_reduce_async(flat, ReduceOp::sum).then([flat, members](Future<void> f) {
      f.get();  // rethrows the collective's error into the returned future
      std::int64_t o = 0;
      for (const auto& p : members) {
        if (p.numel()) p.copy_(flat.flat_slice(o, p.numel()));
        o += p.numel();
      }
    }));
  }
  return detail::when_all(std::move(futures));
}

void average_parameters(const std::vector<Tensor>& params, ProcessGroup group) {
  average_parameters_async(params, std::move(group)).get();
}

void average_parameters_or_parameter_groups(const std::vector<Tensor>& params, ProcessGroup group) {
  average_parameters(get_params_to_average(params), std::move(group));
}

void average_parameters_or_parameter_groups(const std::vector<OptimizerParamGroup>& groups,
                                            ProcessGroup group) {
  average_parameters(get_params_to_average(groups), std::move(group));
}

// --- ModelAverager -------------------------------------------------------------------

ModelAverager::ModelAverager(ProcessGroup process_group, const char* op) : process_group_(std::move(process_group)) {
  if (!process_group_.valid()) throw ValueError(op, "the process group is invalid");
}

void ModelAverager::set_step(std::int64_t step) {
  if (step < 0) throw ValueError("ModelAverager.set_step", "step must be >= 0, got " + std::to_string(step));
  step_ = step;
}

void ModelAverager::replace_process_group(ProcessGroup /*survivors*/) {
  throw NotSupportedError("ModelAverager.replace_process_group",
                          "this averager cannot go on over a shrunk group (only PeriodicModelAverager can): build a "
                          "new one over the survivors' group",
                          process_group_.rank());
}

void PeriodicModelAverager::replace_process_group(ProcessGroup survivors) {
  if (!survivors.valid())
    throw ValueError("PeriodicModelAverager.replace_process_group", "the survivors' group is invalid");
  set_process_group(std::move(survivors));
}

void ModelAverager::take_grown_group(ProcessGroup /*grown*/, const char* op) {
  throw NotSupportedError(op,
                          "this averager cannot go on over a grown group (PeriodicModelAverager, "
                          "HierarchicalModelAverager and DiLoCoAverager can): build a new one over the grown group",
                          process_group_.rank());
}

void PeriodicModelAverager::take_grown_group(ProcessGroup grown, const char* op) {
  if (!grown.valid() || !grown.is_member())
    throw ValueError(op, "the grown group is invalid or does not hold this rank", process_group().rank());
  set_process_group(std::move(grown));
}

void ModelAverager::save_state(StateDict& /*sd*/) const {}
void ModelAverager::load_state(StateDict& /*sd*/) {}

void ModelAverager::average_parameters(const std::vector<Tensor>& params) {
  dopt::detail::CallScope call_scope("ModelAverager::average_parameters()");
  if (auto g = group_for_step(step_)) average_parameters_or_parameter_groups(params, *g);
  ++step_;
}

void ModelAverager::average_parameters(const std::vector<OptimizerParamGroup>& groups) {
  dopt::detail::CallScope call_scope("ModelAverager::average_parameters()");
  if (auto g = group_for_step(step_)) average_parameters_or_parameter_groups(groups, *g);
  ++step_;
}

Future<void> ModelAverager::average_parameters_async(const std::vector<OptimizerParamGroup>& groups) {
  average_parameters(groups);
  return make_ready_future();
}

Future<void> ModelAverager::average_on_schedule_async(const std::vector<OptimizerParamGroup>& groups) {
  // average_parameters(groups) with the wait left out (the same free
  // average_parameters_async underneath).
  Future<void> done = make_ready_future();
  if (auto g = group_for_step(step_)) done = optim::average_parameters_async(get_params_to_average(groups), *g);
  ++step_;
  return done;
}

// --- PeriodicModelAverager -------------------------------------------------------------

PeriodicModelAverager::PeriodicModelAverager(std::int64_t period, std::int64_t warmup_steps,
                                             ProcessGroup process_group)
    : ModelAverager(std::move(process_group), "PeriodicModelAverager"), period_(period), warmup_steps_(warmup_steps) {
  static constexpr const char* op = "PeriodicModelAverager";
  if (warmup_steps < 0)
    throw ValueError(op, "Arg ``warmup_steps`` must be a non-negative number, got " + std::to_string(warmup_steps));
  if (period < 1) throw ValueError(op, "Arg ``period`` must be a positive value, got " + std::to_string(period));
  if (period == 1)
    notice("PeriodicModelAverager [rank " + std::to_string(this->process_group().rank()) +
           "]: period 1 averages after every step, which costs no less than all-reducing the gradients "
           "(DistributedDataParallel); use gradient all-reduce alone for that");
}

std::optional<ProcessGroup> PeriodicModelAverager::group_for_step(std::int64_t step) const {
  if (step >= warmup_steps_ && (step - warmup_steps_) % period_ == 0) return process_group();
  return std::nullopt;
}

// --- HierarchicalModelAverager -----------------------------------------------------------

HierarchicalModelAverager::HierarchicalModelAverager(std::map<std::int64_t, int> period_group_size,
                                                     std::int64_t warmup_steps, ProcessGroup process_group)
    : ModelAverager(std::move(process_group), "HierarchicalModelAverager"),
      period_group_size_(std::move(period_group_size)),
      warmup_steps_(warmup_steps) {
  dopt::detail::CallScope call_scope("HierarchicalModelAverager::HierarchicalModelAverager()");
  static constexpr const char* op = "HierarchicalModelAverager";
  if (period_group_size_.empty()) throw ValueError(op, "Arg ``period_group_size_dict`` must not be empty.");
  const std::int64_t first_period = period_group_size_.begin()->first;
  if (first_period <= 0)
    throw ValueError(op, "The minimum period in arg ``period_group_size_dict`` must be a positive value, got " +
                             std::to_string(first_period) + ".");
  const std::int64_t last_period = period_group_size_.rbegin()->first;
  if (last_period == 1)
    notice("HierarchicalModelAverager [rank " + std::to_string(this->process_group().rank()) +
           "]: the largest period is 1, so parameters are averaged after every step, which costs no less than "
           "all-reducing the gradients (DistributedDataParallel); use gradient all-reduce alone for that");
  const int overall = this->process_group().size();
  const int last_size = period_group_size_.rbegin()->second;
  if (last_size != overall)
    throw ValueError(op, "The last value in arg ``period_process_group_dict`` " + std::to_string(last_size) +
                             " must be equal to the size of arg ``process_group`` " + std::to_string(overall) + ".");
  for (const auto& [period, size] : period_group_size_)
    if (size < 1 || overall % size != 0)
      throw ValueError(op, "the group size " + std::to_string(size) + " of period " + std::to_string(period) +
                               " must be positive and divide the size " + std::to_string(overall) +
                               " of the process group");
  // Over a group that shrink() or grow() made, the ranks first agree on the
  // map and warm-up (a newcomer's averager against the members',
  // averager_agreement.hpp), before any subgroup is made.
  if (!dopt::detail::is_world_group(this->process_group())) {
    ProcessGroup pg = this->process_group();
    detail::agree_averager_config(pg, {detail::AveragerConfig::hierarchical, warmup_steps, period_group_size_}, op);
  }
  groups_ = make_levels(this->process_group(), period_group_size_, op);
  if (warmup_steps < 0)
    throw ValueError(op, "Arg ``warmup_steps`` must be a non-negative number, got " + std::to_string(warmup_steps));
}

std::map<std::int64_t, ProcessGroup> HierarchicalModelAverager::make_levels(
    ProcessGroup pg, const std::map<std::int64_t, int>& period_group_size, const char* op) {
  // One subgroup call per level whose size is not the group's, in ascending
  // period order (the same calls on every member).
  std::map<std::int64_t, ProcessGroup> groups;
  for (const auto& [period, size] : period_group_size) {
    if (size == pg.size()) groups.emplace(period, pg);
    else groups.emplace(period, dopt::detail::subgroups_of(pg, size, op).current);
  }
  return groups;
}

void HierarchicalModelAverager::take_grown_group(ProcessGroup grown, const char* op) {
  if (!grown.valid() || !grown.is_member())
    throw ValueError(op, "the grown group is invalid or does not hold this rank", process_group().rank());
  if (grown.id() == process_group().id()) return;  // a newcomer's averager, built over the grown group
  // The levels as the constructor would take them over the grown group: the
  // last one is the whole group, the others keep their sizes.
  std::map<std::int64_t, int> sizes = period_group_size_;
  sizes.rbegin()->second = grown.size();
  for (const auto& [period, size] : sizes)
    if (grown.size() % size != 0)
      throw ValueError(op, "HierarchicalModelAverager cannot go on over the grown group of " +
                               std::to_string(grown.size()) + " ranks: the group size " + std::to_string(size) +
                               " of period " + std::to_string(period) + " does not divide " +
                               std::to_string(grown.size()) + " (build the averagers anew with group sizes that "
                               "divide it, over the grown group)",
                       grown.rank());
  // The newcomers' constructors make the same exchange (see the constructor).
  if (!dopt::detail::is_world_group(grown))
    detail::agree_averager_config(grown, {detail::AveragerConfig::hierarchical, warmup_steps_, sizes}, op);
  groups_ = make_levels(grown, sizes, op);
  period_group_size_ = std::move(sizes);
  set_process_group(std::move(grown));
}

std::optional<ProcessGroup> HierarchicalModelAverager::group_for_step(std::int64_t step) const {
  if (step < warmup_steps_) return std::nullopt;
  for (auto it = groups_.rbegin(); it != groups_.rend(); ++it)
    if (step % it->first == 0) return it->second;
  return std::nullopt;
}

}  // namespace dopt::optim
