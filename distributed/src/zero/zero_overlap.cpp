// ZeroRedundancyOptimizer with overlap_with_ddp: the plan, the worker thread
// and the comm hooks (contract: dopt/distributed/zero_overlap.hpp).
#include "dopt/distributed/zero_overlap.hpp"

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "dopt/actors/join.hpp"
#include "dopt/actors/internal/sim_hooks.hpp"
#include "survive/agreement.hpp"
#include "zero_core.hpp"
#include "zero_internal.hpp"
#include "zero_overlap_internal.hpp"

namespace dopt::optim {
namespace zero_detail {
namespace {

std::exception_ptr state_error(const std::string& op, const std::string& what, int rank) {
  return std::make_exception_ptr(StateError(op, what, rank));
}

}  // namespace

ZeroOverlap::ZeroOverlap(OverlapHost& host, const ZeroParams& params, const Repoint& repoint, ProcessGroup group,
                         ProcessGroup broadcast_group, std::unique_ptr<FunctionalOptimizer> f)
    : host_(host), params_(params), repoint_(repoint), group_(std::move(group)), rank_(group_.rank()),
      bgroup_(std::move(broadcast_group)), fopt_(std::move(f)) {}

ZeroOverlap::~ZeroOverlap() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) ::dopt::detail::sim::join_thread(worker_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (in_flight_) {
    // Whatever the worker did not finish: the reducer must not wait forever.
    fail_tasks_locked(0, state_error(std::string(kName) + ".overlap",
                                     "the ZeroRedundancyOptimizer was destroyed during an overlapped iteration",
                                     rank_));
    host_.swap_local_state(fopt_->state());
    in_flight_ = false;
  }
}

void ZeroOverlap::fail_tasks_locked(std::size_t from, std::exception_ptr e) {
  for (std::size_t b = from; b < tasks_.size(); ++b) tasks_[b].done.set_exception(e);  // no-op when filled
}

void ZeroOverlap::plan(const Reducer& reducer, const char* op) {
  const int rank = rank_;
  const int world = group_.size();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_) throw StateError(op, "an overlapped iteration is in flight", rank);
  }
  if (!reducer.process_group().valid() || reducer.process_group().ranks() != group_.ranks())
    throw ValueError(op, "the reducer's process group must have the ranks of ZeRO's process group", rank);

  // Buckets from the reducer's layout.
  const auto& rparams = reducer.parameters();
  const auto indices = reducer.bucket_indices();
  std::unordered_map<const TensorImpl*, std::size_t> group_of;
  for (std::size_t g = 0; g < params_.groups().size(); ++g)
    for (const auto& p : params_.groups()[g].params) group_of.emplace(p.key(), g);
  std::vector<Bucket> buckets;
  std::vector<bool> seen(params_.size(), false);
  for (const auto& idx : indices) {
    Bucket bk;
    for (std::size_t i : idx) {
      const Tensor& p = rparams[i];
      const std::int64_t gi = params_.index(p);
      if (gi < 0)
        throw ValueError(op, "reducer parameter " + std::to_string(i) + " (" + p.str() +
                                 ") is not a parameter of the ZeroRedundancyOptimizer", rank);
      seen[static_cast<std::size_t>(gi)] = true;
      if (!bk.params.empty() && p.device() != bk.device)
        throw ValueError(op, "reducer bucket " + std::to_string(buckets.size()) + " holds parameters on " +
                                 bk.device.str() + " and " + p.device().str() +
                                 "; with overlap_with_ddp every bucket must be on one device", rank);
      bk.offsets.push_back(bk.numel);
      bk.group.push_back(group_of.at(p.key()));
      bk.numel += p.numel();
      bk.dtype = p.dtype();
      bk.device = p.device();
      bk.params.push_back(params_.at(static_cast<std::size_t>(gi)));
    }
    buckets.push_back(std::move(bk));
  }
  for (std::size_t i = 0; i < seen.size(); ++i)
    if (!seen[i])
      throw ValueError(op, "ZeRO parameter " + std::to_string(i) + " (" + params_.at(i).str() +
                               ") is in none of the reducer's buckets; with overlap_with_ddp the reducer must "
                               "reduce every parameter of the ZeroRedundancyOptimizer", rank);

  // Owners: by bytes, largest bucket first (stable), to the least loaded rank (ties: lowest).
  std::vector<std::size_t> order(buckets.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto bytes = [&](std::size_t b) { return buckets[b].numel * static_cast<std::int64_t>(itemsize(buckets[b].dtype)); };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return bytes(a) > bytes(b); });
  std::vector<std::int64_t> load(static_cast<std::size_t>(world), 0);
  for (std::size_t b : order) {
    std::size_t r = 0;
    for (std::size_t k = 1; k < load.size(); ++k)
      if (load[k] < load[r]) r = k;
    buckets[b].owner = static_cast<int>(r);
    load[r] += bytes(b);
  }

  if (planned_) {  // a second hook over the same reducer: the plan must be the same
    bool same = buckets.size() == buckets_.size();
    for (std::size_t b = 0; same && b < buckets.size(); ++b) {
      same = buckets[b].owner == buckets_[b].owner && buckets[b].params.size() == buckets_[b].params.size();
      for (std::size_t s = 0; same && s < buckets[b].params.size(); ++s)
        same = buckets[b].params[s].is_same(buckets_[b].params[s]);
    }
    if (!same)
      throw StateError(op, "this ZeroRedundancyOptimizer already has an overlap plan from another reducer layout",
                       rank);
  }

  // Agreement: every rank's descriptor must equal rank 0's.
  detail::StructureHash h;
  std::int64_t total = 0;
  for (const auto& bk : buckets) {
    h.mix(bk.params.size());
    h.mix(static_cast<std::uint64_t>(bk.owner));
    h.mix(static_cast<std::uint64_t>(bk.dtype));
    for (const auto& p : bk.params) h.mix(static_cast<std::uint64_t>(params_.index(p)));
    total += bk.numel;
  }
  const auto all = detail::all_gather_descriptors(
      group_, {h.value(), static_cast<std::int64_t>(buckets.size()), total, static_cast<std::int64_t>(world)});
  for (int r = 1; r < world; ++r)
    if (!all.same(static_cast<std::size_t>(r), 0))
      throw ValueError(op, "the overlap plans differ across ranks: rank " + std::to_string(r) +
                               " has another bucket layout than rank 0 (every rank's reducer must have the same "
                               "parameters and bucket caps)", rank);
  if (planned_) return;

  // One flat buffer per bucket, on the parameters' device; the parameters
  // become views of it (a CUDA parameter stays in device memory).
  for (auto& bk : buckets) {
    bk.flat = Tensor::empty({bk.numel}, bk.dtype, bk.device);
    for (std::size_t s = 0; s < bk.params.size(); ++s) {
      const Tensor& p = bk.params[s];
      Tensor slice = bk.flat.flat_slice(bk.offsets[s], p.numel());
      slice.copy_(p);
      repoint_(p, slice.view(p.shape()));
    }
  }

  // ZeRO's partition and local optimizer follow the plan.
  Partition part = Partition::blank(params_.groups().size(), params_.size(), world);
  for (const auto& bk : buckets)
    for (std::size_t s = 0; s < bk.params.size(); ++s)
      part.assign(bk.params[s], params_.index_of(bk.params[s]), bk.group[s], bk.owner);
  host_.adopt_plan(std::move(part));
  buckets_ = std::move(buckets);
  planned_ = true;
  worker_ = ::dopt::detail::sim::make_thread([this] { run(); }, "zero overlap");
}

std::vector<int> ZeroOverlap::bucket_owners() const {
  std::vector<int> out;
  for (const auto& bk : buckets_) out.push_back(bk.owner);
  return out;
}

void ZeroOverlap::require_idle(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!planned_)
    throw StateError(op, "with overlap_with_ddp=true this needs the overlap plan: build the comm hook with "
                         "hook_with_zero_step or hook_with_zero_step_interleaved first", rank_);
  if (in_flight_)
    throw StateError(op, "an overlapped iteration is in flight; call it after Reducer::finalize()", rank_);
}

void ZeroOverlap::begin_iteration() {
  const std::string op = std::string(kName) + ".overlap";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!planned_) throw StateError(op, "no overlap plan", rank_);
    if (in_flight_)
      throw StateError(op, "the previous overlapped iteration did not complete (every bucket must be reduced, "
                           "i.e. Reducer::finalize() called, before the next iteration)", rank_);
  }
  Future<void> notify = host_.notify_join();
  std::vector<Hyperparams> hyper = host_.hyperparams();
  std::lock_guard<std::mutex> lock(mutex_);
  hyper_ = std::move(hyper);
  current_group_ = static_cast<std::size_t>(-1);
  host_.swap_local_state(fopt_->state());
  notify_ = std::move(notify);
  tasks_.clear();
  last_error_ = nullptr;
  in_flight_ = true;
}

Future<Tensor> ZeroOverlap::on_bucket(const GradBucket& bucket, Future<Tensor> reduced, bool interleaved) {
  const std::string op = std::string(kName) + ".overlap";
  std::unique_lock<std::mutex> lock(mutex_);
  if (!in_flight_) throw StateError(op, "bucket " + std::to_string(bucket.index()) + " outside an iteration", rank_);
  const std::size_t b = bucket.index();
  if (b != tasks_.size() || bucket.is_last() != (b + 1 == buckets_.size()))
    throw StateError(op, "bucket " + std::to_string(b) + " arrived out of order or the reducer's layout changed",
                     rank_);
  if (bucket.buffer().numel() != buckets_[b].numel)
    throw ShapeError(op, "bucket " + std::to_string(b) + " has " + std::to_string(bucket.buffer().numel()) +
                             " elements, the plan " + std::to_string(buckets_[b].numel), rank_);
  if (b == 0) interleaved_ = interleaved;
  // Buckets before the last: the reducer may copy the reduced values into the
  // grads at once (the worker only reads them too). The last one completes
  // when the whole iteration has (see the header).
  Task t{reduced, Promise<Tensor>()};
  Future<Tensor> out = bucket.is_last() ? t.done.get_future() : reduced;
  tasks_.push_back(std::move(t));
  lock.unlock();
  cv_.notify_all();
  return out;
}

void ZeroOverlap::wait_step() {
  const std::string op = std::string(kName) + ".step";
  std::unique_lock<std::mutex> lock(mutex_);
  if (in_flight_) {
    if (tasks_.size() < buckets_.size())
      throw StateError(op, "the reducer's iteration is not complete (" + std::to_string(tasks_.size()) + " of " +
                               std::to_string(buckets_.size()) + " buckets handed over): call Reducer::finalize() "
                               "before step()", rank_);
    ::dopt::detail::sim::cv_wait(idle_, lock, [&] { return !in_flight_; }, "zero overlap step");
  }
  if (last_error_) std::rethrow_exception(last_error_);
}

void ZeroOverlap::step_bucket(std::size_t b, const Tensor& reduced) {
  const std::string op = std::string(kName) + ".overlap";
  Bucket& bk = buckets_[b];
  if (reduced.numel() != bk.numel)
    throw ShapeError(op, "the comm hook returned " + reduced.str() + " for bucket " + std::to_string(b) + " of " +
                             std::to_string(bk.numel) + " elements", rank_);
  Tensor flat = reduced.dim() == 1 ? reduced : reduced.flatten();
  if (flat.dtype() != bk.dtype) {  // as Reducer::finalize converts into the grads, on the bucket's device
    Tensor c = Tensor::empty({bk.numel}, bk.dtype, bk.device);
    c.copy_(flat);
    flat = c;
  }
  for (std::size_t s = 0; s < bk.params.size(); ++s) {
    const Tensor& p = bk.params[s];
    if (bk.group[s] != current_group_) {
      fopt_->set_defaults(hyper_[bk.group[s]]);
      current_group_ = bk.group[s];
    }
    fopt_->step_param(p, flat.flat_slice(bk.offsets[s], p.numel()).view(p.shape()));
  }
}

void ZeroOverlap::run() {
  const int rank = rank_;
  const std::size_t nb = buckets_.size();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ::dopt::detail::sim::cv_wait(cv_, lock, [&] { return stop_ || (in_flight_ && !tasks_.empty()); }, "zero overlap");
    if (stop_) return;
    std::exception_ptr error;
    std::vector<Future<void>> bcasts;
    Tensor last_value;
    for (std::size_t b = 0; b < nb; ++b) {
      ::dopt::detail::sim::cv_wait(cv_, lock, [&] { return stop_ || (tasks_.size() > b && (interleaved_ || tasks_.size() == nb)); },
                           "zero overlap");
      if (stop_) {
        lock.unlock();
        for (auto& f : bcasts) f.wait();  // nothing may still write into the buffers
        return;                           // the destructor fails what is left
      }
      Future<Tensor> reduced = tasks_[b].reduced;
      const Bucket& bk = buckets_[b];
      lock.unlock();
      std::exception_ptr bucket_error;
      Tensor value;
      if (bk.owner == rank) {
        try {
          value = reduced.get();
          step_bucket(b, value);
        } catch (...) {
          bucket_error = std::current_exception();
        }
      }
      // Every rank posts every bucket's broadcast, in bucket order, even after
      // an error, so the ranks' sequences on the broadcast group stay aligned.
      try {
        bcasts.push_back(bgroup_.broadcast_async(bk.flat, bk.owner));
      } catch (...) {
        if (!bucket_error) bucket_error = std::current_exception();
      }
      if (bucket_error && !error) error = bucket_error;
      if (b + 1 == nb) last_value = value;
      lock.lock();
    }
    Future<Tensor> last_reduced = tasks_[nb - 1].reduced;
    Promise<Tensor> last_done = tasks_[nb - 1].done;
    Future<void> notify = notify_;
    const bool owner_of_last = buckets_[nb - 1].owner == rank;
    lock.unlock();
    for (auto& f : bcasts) wait_keeping_first_error(f, error);
    if (notify.valid()) wait_keeping_first_error(notify, error);
    if (!owner_of_last) {
      try {
        last_value = last_reduced.get();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    lock.lock();
    host_.swap_local_state(fopt_->state());
    host_.count_overlapped_step();
    last_error_ = error;
    notify_ = Future<void>();
    in_flight_ = false;
    lock.unlock();
    idle_.notify_all();
    if (error) last_done.set_exception(error);
    else last_done.set_value(last_value);
    lock.lock();
  }
}

}  // namespace zero_detail

namespace {

using zero_detail::ZeroOverlap;

CommHook make_zero_hook(CommHook hook, const Reducer& reducer, ZeroRedundancyOptimizer& zero, bool interleaved,
                        const char* op) {
  if (!hook) throw ValueError(op, "the inner hook is empty", zero.rank());
  if (!zero.overlap_with_ddp())
    throw ValueError(op, "ZeroRedundancyOptimizer must be constructed with `overlap_with_ddp=True` to use this "
                         "hook properly", zero.rank());
  std::shared_ptr<ZeroOverlap> engine = ZeroCoreAccess::core(zero).overlap;
  engine->plan(reducer, op);
  std::weak_ptr<ZeroOverlap> weak = engine;
  return [inner = std::move(hook), weak, interleaved, op](GradBucket& bucket) -> Future<Tensor> {
    std::shared_ptr<ZeroOverlap> e = weak.lock();
    if (!e) throw StateError(op, "the ZeroRedundancyOptimizer of this hook no longer exists");
    if (bucket.index() == 0) e->begin_iteration();
    Future<Tensor> reduced;
    try {
      reduced = inner(bucket);
      if (!reduced.valid()) throw StateError(op, "the inner comm hook returned an invalid future");
    } catch (...) {
      reduced = make_failed_future<Tensor>(std::current_exception());
    }
    return e->on_bucket(bucket, std::move(reduced), interleaved);
  };
}

}  // namespace

CommHook hook_with_zero_step(CommHook hook, const Reducer& reducer, ZeroRedundancyOptimizer& zero) {
  return make_zero_hook(std::move(hook), reducer, zero, /*interleaved=*/false, "hook_with_zero_step");
}

CommHook hook_with_zero_step_interleaved(CommHook hook, const Reducer& reducer, ZeroRedundancyOptimizer& zero) {
  return make_zero_hook(std::move(hook), reducer, zero, /*interleaved=*/true, "hook_with_zero_step_interleaved");
}

}  // namespace dopt::optim
