// ZeroCore (zero_core.hpp): construction, add_param_group, step(),
// step_async() and the overlap driver's host side. The pieces do the rest.
#include "zero_core.hpp"

#include "dopt/actors/internal/call_label.hpp"
#include "dopt/actors/join.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/optim/internal/write_fence.hpp"
#include "dopt/runtime/notice.hpp"
#include "survive/step_in_flight.hpp"
#include "zero_internal.hpp"
#include "zero_shard_sync.hpp"

namespace dopt::optim {

using zero_detail::kName;

ZeroCore::ZeroCore(ZeroRedundancyOptimizer& self_, std::vector<OptimizerParamGroup> groups, OptimizerSpec spec_,
                   ZeroOptions options)
    : self(self_), spec(std::move(spec_)), group(std::move(options.process_group)),
      bucket_view(options.parameters_as_bucket_view), weight(options.partition_weight),
      buddy_update(options.buddy_update), params(spec.name), repoint(std::move(options.rebind_parameter)),
      probe(std::move(options.probe)), on_membership_change(std::move(options.on_membership_change)) {
  dopt::detail::CallScope call_scope("ZeroRedundancyOptimizer::ZeroRedundancyOptimizer()");
  if (!group.valid() || !group.is_member())
    throw ValueError(kName, "a valid process group this rank is a member of is required");
  rank = group.rank();
  world = group.size();
  if (options.redundancy < 0)
    throw ValueError(kName, "redundancy must be >= 0, got " + std::to_string(options.redundancy), rank);
  if (options.snapshot_interval < 1)
    throw ValueError(kName, "snapshot_interval must be >= 1, got " + std::to_string(options.snapshot_interval), rank);
  if (options.redundancy > 0 && options.overlap_with_ddp)
    throw NotSupportedError(kName, "redundancy is not available with overlap_with_ddp=true", rank);
  params.set_defaults(make_options(spec));
  if (groups.empty()) throw ValueError(kName, "ZeroRedundancyOptimizer got an empty parameter list");
  for (auto& g : groups) params.add(std::move(g), kName, rank);
  if (params.size() == 0) throw ValueError(kName, "ZeroRedundancyOptimizer got an empty parameter list");
  if (options.overlap_with_ddp)
    repoint.check(params.all(), params, kName,
                  "overlap_with_ddp makes each reducer bucket's parameters views of one flat buffer", rank);
  else if (bucket_view)
    repoint.check(params.all(), params, kName,
                  "parameters_as_bucket_view makes the parameters views of one flat buffer per rank", rank);
  std::unique_ptr<FunctionalOptimizer> functional;
  if (options.overlap_with_ddp) {
    bucket_view = false;  // torch: ignored with overlap (each reducer bucket is one flat buffer)
    try {
      functional = make_functional(OptimizerSpec{spec.name, params.groups().front().options->to_hyperparams()}, {},
                                   /*allow_empty_param_list=*/true);
    } catch (const ValueError&) {
      throw ValueError(kName, "Using `overlap_with_ddp=true` requires using a functional optimizer, but there is "
                              "no supported functional optimizer equivalent for " + spec.name, rank);
    }
    const ProcessGroup& bg = options.overlap_broadcast_group;
    if (bg.valid() && (!bg.is_member() || bg.ranks() != group.ranks()))
      throw ValueError(kName, "overlap_broadcast_group must have the ranks of process_group", rank);
  }
  redundancy = zero_detail::make_redundancy(options);
  params.check_same_everywhere(group, weight, kName, rank);
  if (options.overlap_with_ddp) {
    ProcessGroup bgroup = options.overlap_broadcast_group;
    if (!bgroup.valid()) {
      try {
        bgroup = group.new_group(group.ranks());
      } catch (const StateError&) {
        throw ValueError(kName, "overlap_with_ddp on a process group other than the world needs "
                                "ZeroOptions::overlap_broadcast_group (a second group over the same ranks, "
                                "made with world.new_group(ranks))", rank);
      }
    }
    // No partition until the plan (hook_with_zero_step*): empty local groups.
    part = zero_detail::Partition::none(params, world);
    remake_local_optimizer();
    trainable = params.trainable_mask();
    overlap = std::make_shared<zero_detail::ZeroOverlap>(*this, params, repoint, group, std::move(bgroup),
                                                         std::move(functional));
    return;
  }
  redundancy->check(*this, options);
  part = zero_detail::Partition::balanced(params, params.weights(weight), world);
  remake_local_optimizer();
  trainable = params.trainable_mask();
  redundancy->start(*this, options);
}

ZeroCore::~ZeroCore() {
  if (in_flight.valid()) in_flight.wait();  // the broadcasts write into our buffers; their error is dropped
  overlap.reset();  // stops the worker before anything it uses goes
}

void ZeroCore::remake_local_optimizer() { optim = make_optimizer(spec, part.local_groups(params, rank)); }

void ZeroCore::require_overlap_idle(const std::string& op) const {
  if (overlap) overlap->require_idle(op);
}

void ZeroCore::add_param_group(OptimizerParamGroup group_to_add) {
  const std::string op = std::string(kName) + ".add_param_group";
  settle(op);
  if (overlap)
    throw NotSupportedError(op, "ZeroRedundancyOptimizer with overlap_with_ddp=true cannot add parameter groups "
                                "(the reducer's buckets are fixed); pass every group to the constructor", rank);
  redundancy->check_add_group(op, rank);
  // Validate first, so a failure (local or the cross-rank check) leaves the
  // optimizer unchanged.
  const auto saved_groups = params.groups().size();
  const auto saved_params = params.size();
  try {
    params.add(std::move(group_to_add), op.c_str(), rank);
    if (bucket_view)
      repoint.check(std::vector<Tensor>(params.all().begin() + static_cast<std::ptrdiff_t>(saved_params),
                                        params.all().end()),
                    params, op.c_str(), "parameters_as_bucket_view makes the parameters views of one flat buffer per rank",
                    rank);
    params.check_same_everywhere(group, weight, op.c_str(), rank);
  } catch (...) {
    params.truncate(saved_groups, saved_params);
    throw;
  }
  part = zero_detail::Partition::balanced(params, params.weights(weight), world);
  sync_to_local();
  for (auto& g : part.local_groups(params, rank, params.groups().size() - 1)) optim->add_param_group(std::move(g));
  trainable = params.trainable_mask();
  if (bucket_view) buckets.build(part, rank, repoint);
}

void ZeroCore::sync_to_local() {
  auto& local = optim->param_groups();
  const auto& groups = params.groups();
  for (std::size_t g = 0; g < groups.size() && g < local.size(); ++g) local[g].options = groups[g].options->clone();
}

void ZeroCore::sync_from_local() {
  const auto& local = optim->param_groups();
  auto& groups = params.groups();
  for (std::size_t g = 0; g < groups.size() && g < local.size(); ++g) groups[g].options = local[g].options->clone();
}

void ZeroCore::broadcast_shards(const std::function<void()>& meanwhile) {
  zero_detail::ShardSync(group, part, buckets, bucket_view)
      .run([this](int i) { probe_at("broadcast", i); }, meanwhile);
}

Future<void> ZeroCore::post_shards(const Future<void>& notify) {
  Future<void> shards = zero_detail::ShardSync(group, part, buckets, bucket_view).start([this](int i) {
    probe_at("broadcast", i);
  });
  return when_all(std::vector<Future<void>>{shards, notify});
}

void ZeroCore::settle(const std::string& op) const {
  const std::string what = "the broadcasts of step_async() (step " + std::to_string(in_flight_step) + ")";
  detail::settle_in_flight(in_flight, failed, what, /*keep_error=*/true, op, rank);
}

std::optional<double> ZeroCore::step(const Optimizer::LossClosure& closure) {
  settle(std::string(kName) + ".step");
  dopt::detail::fence_wait();  // a background snapshot still copies the parameters or the shard
  if (overlap) {
    if (closure)
      throw ValueError(std::string(kName) + ".step",
                       "a closure cannot be used with overlap_with_ddp=true (the steps run in the comm hook)", rank);
    overlap->wait_step();
    return std::nullopt;
  }
  redundancy->check_closure(closure, rank);
  Future<void> notify;
  std::optional<double> loss = local_step(closure, notify);
  std::optional<ZeroRecovery> rec = redundancy->finish_step(*this, notify);
  if (!rec) return loss;
  if (!on_membership_change)
    throw MembershipChangedError(std::string(kName) + ".step",
                                 "recovered from the loss of rank(s) of the group; the step was completed, " +
                                     std::to_string(rec->group.size()) + " rank(s) continue",
                                 *rec, rank);
  on_membership_change(*rec);
  return loss;
}

Future<void> ZeroCore::step_async() {
  settle(std::string(kName) + ".step_async");
  dopt::detail::fence_wait();
  if (overlap || !redundancy->background_broadcasts()) {
    step(nullptr);  // completes here (zero.hpp); its errors are thrown
    return make_ready_future();
  }
  Future<void> notify;
  local_step(nullptr, notify);
  in_flight = post_shards(notify);
  in_flight_step = steps++;
  return in_flight;
}

std::optional<double> ZeroCore::local_step(const Optimizer::LossClosure& closure, Future<void>& notify) {
  notify = Join::notify_join_context(self);
  const auto mask = params.trainable_mask();
  if (mask != trainable) {
    if (bucket_view) {
      notice(std::string(kName) + " [rank " + std::to_string(rank) +
             "]: the trainable parameters changed; rebuilding the parameter buckets");
      redundancy->build_buckets(*this);
    }
    trainable = mask;
  }
  probe_at("begin", 0);
  sync_to_local();
  std::optional<double> loss = optim->step(closure);
  redundancy->after_local_step(*this);
  sync_from_local();
  probe_at("computed", 0);
  return loss;
}

void ZeroCore::zero_grad(bool set_to_none) {
  for (const auto& p : params.all()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else g.zero_();
  }
}

// --- OverlapHost -----------------------------------------------------------------

void ZeroCore::adopt_plan(zero_detail::Partition plan) {
  part = std::move(plan);
  remake_local_optimizer();
  sync_to_local();
}

Future<void> ZeroCore::notify_join() { return Join::notify_join_context(self); }

std::vector<Hyperparams> ZeroCore::hyperparams() const {
  std::vector<Hyperparams> out;
  for (const auto& g : params.groups()) out.push_back(g.options->to_hyperparams());
  return out;
}

void ZeroCore::swap_local_state(zero_detail::StateByParam& state) { std::swap(optim->state(), state); }

}  // namespace dopt::optim
