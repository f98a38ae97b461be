#include "dopt/distributed/reducer.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "dopt/distributed/internal/device_ops.hpp"
#include "survive/survive_util.hpp"
#include "dopt/actors/internal/call_label.hpp"

namespace dopt::optim {

namespace {
constexpr const char* kOp = "Reducer";

}  // namespace

class ReducerJoinHook : public JoinHook {
 public:
  explicit ReducerJoinHook(Reducer& r) : r_(r) {}
  void main_hook() override { r_.shadow_iteration(); }

 private:
  Reducer& r_;
};

Reducer::Reducer(std::vector<Tensor> params, ProcessGroup process_group, ReducerOptions options)
    : params_(std::move(params)), group_(std::move(process_group)), options_(options) {
  dopt::detail::CallScope call_scope("Reducer::Reducer()");
  if (!group_.valid()) throw ValueError(kOp, "the process group is invalid");
  if (params_.empty()) throw ValueError(kOp, "got an empty parameter list");
  if (options_.bucket_cap_bytes == 0 || options_.first_bucket_cap_bytes == 0)
    throw ValueError(kOp, "bucket caps must be positive");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.defined()) throw ValueError(kOp, "parameter " + std::to_string(i) + " is undefined");
    if (p.device() != params_.front().device())
      throw ValueError(kOp, "parameter " + std::to_string(i) + " is on " + p.device().str() + ", parameter 0 on " +
                                params_.front().device().str() + ": all parameters must be on one device");
    if (!is_floating_point(p.dtype()))
      throw TypeError(kOp, "parameter " + std::to_string(i) + " is not floating point: " + p.str());
    if (!index_of_.emplace(p.key(), i).second)
      throw ValueError(kOp, "parameter " + std::to_string(i) + " is registered twice");
  }

  // DDP's compute_bucket_assignment_by_size over registration order, limits
  // [first_bucket_cap, bucket_cap] per dtype, sorted by first index, then reversed.
  struct Open {
    std::vector<std::size_t> idx;
    std::size_t bytes = 0;
    bool first = true;
  };
  std::map<DType, Open> open;
  std::vector<std::vector<std::size_t>> result;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Open& o = open[params_[i].dtype()];
    o.idx.push_back(i);
    o.bytes += params_[i].nbytes();
    const std::size_t limit = o.first ? options_.first_bucket_cap_bytes : options_.bucket_cap_bytes;
    if (o.bytes >= limit) {
      result.push_back(std::move(o.idx));
      o.idx.clear();
      o.bytes = 0;
      o.first = false;
    }
  }
  for (auto& [dt, o] : open)
    if (!o.idx.empty()) result.push_back(std::move(o.idx));
  std::sort(result.begin(), result.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  std::reverse(result.begin(), result.end());
  if (!options_.gradient_owners.empty()) {
    check_gradient_owners();
    owner_of_ = options_.gradient_owners;
    stage2_ = true;
    // Stage 2: each owner's parameters contiguous inside every bucket.
    for (auto& r : result)
      std::stable_sort(r.begin(), r.end(), [&](std::size_t a, std::size_t b) { return owner_of_[a] < owner_of_[b]; });
  }

  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  marked_.assign(params_.size(), false);
  for (std::size_t b = 0; b < result.size(); ++b) {
    Bucket bucket;
    bucket.params = result[b];
    std::int64_t off = 0;
    for (std::size_t s = 0; s < bucket.params.size(); ++s) {
      const std::size_t i = bucket.params[s];
      bucket_of_[i] = b;
      slot_of_[i] = s;
      bucket.offsets.push_back(off);
      if (stage2_ && (bucket.segments.empty() || bucket.segments.back().owner != owner_of_[i]))
        bucket.segments.push_back({off, 0, owner_of_[i]});
      if (stage2_) bucket.segments.back().numel += params_[i].numel();
      off += params_[i].numel();
    }
    bucket.numel = off;
    // Stage 2 allocates the buffer when the bucket's first gradient arrives.
    if (!stage2_) bucket.buffer = Tensor::zeros({off}, params_[bucket.params.front()].dtype(), params_.front().device());
    bucket.pending = bucket.params.size();
    buckets_.push_back(std::move(bucket));
  }

  hook_ = allreduce_hook(group_);
  if (options_.broadcast_parameters && group_.is_member()) {
    std::vector<Future<void>> fs;
    for (const auto& p : params_) fs.push_back(group_.broadcast_async(p, 0));
    for (auto& f : fs) f.get();
  }
}

Reducer::~Reducer() {
  // Never leave a collective writing into freed buffers.
  for (auto& b : buckets_)
    if (b.result.valid()) b.result.wait();
  if (join_notify_.valid()) join_notify_.wait();
}

void Reducer::register_comm_hook(CommHook hook) {
  if (!hook) throw ValueError("Reducer.register_comm_hook", "the hook is empty");
  if (options_.survive)
    throw NotSupportedError("Reducer.register_comm_hook",
                            "a comm hook cannot be registered with ReducerOptions::survive: the hook's state holds "
                            "the process group, which recovery replaces (survive uses the default allreduce hook)",
                            group_.rank());
  if (started_)
    throw StateError("Reducer.register_comm_hook",
                     "register_comm_hook can only be called once, before the first iteration");
  hook_ = std::move(hook);
  started_ = true;  // a second registration is refused as well
}

void Reducer::mark_ready(const Tensor& param) {
  dopt::detail::CallScope call_scope("Reducer::mark_ready()");
  static constexpr const char* op = "Reducer.mark_ready";
  check_defined(param, op, "parameter");
  auto it = index_of_.find(param.key());
  if (it == index_of_.end())
    throw ValueError(op, "the parameter " + param.str() + " was not registered with this reducer");
  const std::size_t i = it->second;
  if (marked_[i])
    throw StateError(op, "parameter " + std::to_string(i) + " (" + param.str() +
                             ") was marked ready twice in one iteration");
  const Tensor g = param.grad();
  if (g.defined()) {
    if (g.shape() != param.shape())
      throw ShapeError(op, "the gradient of parameter " + std::to_string(i) + " is " + g.str() +
                               ", the parameter " + param.str());
    if (g.dtype() != param.dtype())
      throw DTypeError(op, "the gradient of parameter " + std::to_string(i) + " is " + g.str() +
                               ", the parameter " + param.str());
  }
  started_ = true;
  if (!in_iteration_) {
    in_iteration_ = true;
    if (require_sync_) join_notify_ = Join::notify_join_context(*this);
  }
  marked_[i] = true;
  ++num_marked_;
  if (!require_sync_) return;
  Bucket& b = buckets_[bucket_of_[i]];
  if (stage2_) ensure_buffer(b);
  Tensor slot = b.buffer.flat_slice(b.offsets[slot_of_[i]], param.numel());
  if (g.defined()) slot.copy_(g);
  else slot.zero_();
  if (stage2_ && owner_of_[i] != group_.rank()) params_[i].set_grad(Tensor());  // stage 2: its owner keeps it
  if (--b.pending == 0 && options_.overlap) launch_ready();
}

void Reducer::launch(std::size_t b) {
  Bucket& bucket = buckets_[b];
  std::vector<Tensor> ps;
  for (auto i : bucket.params) ps.push_back(params_[i]);
  if (options_.survive) bucket.saved = bucket.buffer.clone();  // what a recovery reduces again
  GradBucket gb(b, buckets_.size(), bucket.buffer, std::move(ps), bucket.offsets);
  try {
    if (stage2_) gb.set_owner_segments(bucket.segments);  // the built-in hooks reduce each onto its owner
    bucket.result = hook_(gb);
  } catch (...) {
    bucket.result = make_failed_future<Tensor>(std::current_exception());
  }
  if (!bucket.result.valid())
    bucket.result = make_failed_future<Tensor>(
        std::make_exception_ptr(StateError("Reducer", "the comm hook returned an invalid future")));
}

void Reducer::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
}

void Reducer::reset_iteration() {
  std::fill(marked_.begin(), marked_.end(), false);
  num_marked_ = 0;
  next_launch_ = 0;
  in_iteration_ = false;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.result = Future<Tensor>();
    b.written = false;
  }
}

void Reducer::finalize() {
  dopt::detail::CallScope call_scope("Reducer::finalize()");
  static constexpr const char* op = "Reducer.finalize";
  started_ = true;
  if (!require_sync_) {
    reset_iteration();
    return;
  }
  if (num_marked_ < params_.size()) {
    if (!options_.find_unused_parameters) {
      std::size_t first = 0;
      while (marked_[first]) ++first;
      // Wait for what was launched before failing, so no collective outlives its buffer.
      for (auto& b : buckets_)
        if (b.result.valid()) b.result.wait();
      const std::size_t missing = params_.size() - num_marked_;
      reset_iteration();
      throw StateError(op, std::to_string(missing) + " parameter(s) were not marked ready in this iteration, "
                               "the first is parameter " + std::to_string(first) +
                               " (set find_unused_parameters to reduce them as zeros)");
    }
    const bool overlap = options_.overlap;
    options_.overlap = false;  // launch once, below
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!marked_[i]) {
        Tensor p = params_[i];
        Tensor g = p.grad();
        p.set_grad(Tensor());  // an unused parameter contributes zeros
        mark_ready(p);
        p.set_grad(g);
      }
    options_.overlap = overlap;
  }
  launch_ready();
  std::exception_ptr error = write_results(op);
  if (join_notify_.valid()) {
    wait_keeping_first_error(join_notify_, error);
    join_notify_ = Future<void>();
  }
  const bool lost = options_.survive && detail::is_peer_lost(error);
  if (lost) {
    ZeroRecovery rec = recover_in_finalize();  // throws what it cannot recover from
    reset_iteration();
    ++iterations_;
    rec.step = iterations_;
    rec.step_completed = true;
    if (options_.on_membership_change) return options_.on_membership_change(rec);
    throw MembershipChangedError(op,
                                 "rank(s) of the reducer's group were lost; the survivors' group took over and this "
                                 "iteration's gradients were reduced again over it (recovery().group)",
                                 rec, rec.group.rank());
  }
  reset_iteration();
  ++iterations_;
  if (error) std::rethrow_exception(error);
}

void Reducer::write_bucket(Bucket& b, const Tensor& reduced, const char* op) {
  if (reduced.numel() != b.numel)
    throw ShapeError(op, "the comm hook returned " + reduced.str() + " for a bucket of " + std::to_string(b.numel) +
                             " elements");
  Tensor flat = reduced.dim() == 1 ? reduced : reduced.flatten();
  for (std::size_t s = 0; s < b.params.size(); ++s) {
    const Tensor& p = params_[b.params[s]];
    if (stage2_ && owner_of_[b.params[s]] != group_.rank()) {
      p.set_grad(Tensor());  // stage 2: only the owner keeps the average
      continue;
    }
    Tensor src = flat.flat_slice(b.offsets[s], p.numel());
    Tensor g = p.grad();
    if (!g.defined()) {
      g = Tensor::empty(p.shape(), p.dtype(), p.device());
      p.set_grad(g);
    }
    detail::convert_any_(g, src);  // a plain copy unless a custom hook returned another dtype
  }
}

std::exception_ptr Reducer::write_results(const char* op) {
  std::exception_ptr error;
  for (auto& b : buckets_) {
    try {
      Tensor reduced = b.result.get();
      if (!b.written) write_bucket(b, reduced, op);  // stage 2: a bucket mark_ready harvested is written
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    if (stage2_) release_buffer(b);
  }
  if (stage2_) trim_spares();
  return error;
}

ZeroRecovery Reducer::recover_in_finalize() {
  static constexpr const char* op = "Reducer.finalize";
  // Every bucket again from the local gradients it was launched with, over
  // the survivors (a bucket that completed had the lost rank's share in it).
  return detail::shrink_and_redo(group_, op, {iterations_, 1}, [&](ProcessGroup& ng) {
    CommHook hook = allreduce_hook(ng);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      Bucket& bucket = buckets_[b];
      bucket.buffer.copy_(bucket.saved);
      std::vector<Tensor> ps;
      for (auto i : bucket.params) ps.push_back(params_[i]);
      GradBucket gb(b, buckets_.size(), bucket.buffer, std::move(ps), bucket.offsets);
      bucket.result = hook(gb);
    }
    std::exception_ptr error = write_results(op);
    if (error) std::rethrow_exception(error);  // a further loss: shrink_and_redo starts again
    group_ = ng;
    hook_ = std::move(hook);
  });
}

ZeroRecovery Reducer::recover(std::optional<ProcessGroup> shrunk) {
  dopt::detail::CallScope call_scope("Reducer::recover()");
  static constexpr const char* op = "Reducer.recover";
  if (!options_.survive)
    throw StateError(op, "recovery needs ReducerOptions::survive (no copy of the local gradients is kept)",
                     group_.rank());
  if (in_iteration_) {
    for (auto& b : buckets_)
      if (b.result.valid()) b.result.wait();
    if (join_notify_.valid()) join_notify_.wait();
    join_notify_ = Future<void>();
    reset_iteration();  // the iteration in flight is dropped: the trainer computes it again
  }
  ZeroRecovery rec;
  if (shrunk) {
    ProcessGroup ng = *shrunk;
    detail::check_same_point(ng, op, {iterations_, 0}, ng.global_rank(ng.rank()));
    rec.group = ng;
    rec.step = iterations_;
  } else {
    rec = detail::shrink_and_redo(group_, op, {iterations_, 0}, {});
  }
  group_ = rec.group;
  hook_ = allreduce_hook(group_);
  rec.step = iterations_;
  rec.step_completed = false;
  return rec;
}

void Reducer::shadow_iteration() {
  shadowing_ = true;  // stage 2: a bucket whose buffer is reused is not written
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (stage2_) ensure_buffer(buckets_[b]);
    buckets_[b].buffer.zero_();
    launch(b);
  }
  std::exception_ptr error;
  for (auto& b : buckets_) {
    wait_keeping_first_error(b.result, error);
    b.result = Future<Tensor>();
    if (stage2_) release_buffer(b);
  }
  shadowing_ = false;
  if (stage2_) trim_spares();
  if (error) std::rethrow_exception(error);
}

std::unique_ptr<JoinHook> Reducer::join_hook() { return std::make_unique<ReducerJoinHook>(*this); }

std::int64_t Reducer::gradient_bytes() const {
  std::int64_t n = 0;
  for (const auto& p : params_)
    if (p.grad().defined()) n += static_cast<std::int64_t>(p.grad().nbytes());
  for (const auto& b : buckets_) {
    const Tensor& held = b.storage.defined() ? b.storage : b.buffer;
    if (held.defined()) n += static_cast<std::int64_t>(held.nbytes());
    if (b.saved.defined()) n += static_cast<std::int64_t>(b.saved.nbytes());
  }
  for (const auto& t : spares_) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

std::vector<std::vector<std::size_t>> Reducer::bucket_indices() const {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

}  // namespace dopt::optim
