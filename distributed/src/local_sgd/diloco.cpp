#include "dopt/distributed/diloco.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>
#include <string>
#include <utility>

#include "dopt/runtime/state_dict.hpp"
#include "ddp/plsgd_util.hpp"
#include "dopt/optim/internal/state_load.hpp"
#include "dopt/actors/internal/call_label.hpp"
#include "dopt/optim/internal/write_fence.hpp"

namespace dopt::optim {

namespace {

constexpr const char* kOp = "DiLoCoAverager";
constexpr const char* kAnchorKey = "diloco.anchor";
constexpr const char* kOuterPrefix = "diloco.outer.";
constexpr const char* kResidualKey = "diloco.residual";
constexpr const char* kPendingKey = "diloco.pending";
constexpr const char* kFormatMeta = "diloco.format";
constexpr const char* kFragmentsMeta = "diloco.fragments";
constexpr const char* kPendingMeta = "diloco.pending_fragment";
constexpr const char* kSyncsMeta = "diloco.syncs";
constexpr const char* kOuterMetaPrefix = "diloco.outer_optimizer.";
constexpr const char* kShardedMeta = "diloco.sharded";
constexpr const char* kShardsMeta = "diloco.shards";

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// out = a - b, elementwise in the tensors' dtype (16-bit floats: in float, rounded once).
void sub_into(const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      T* o = out.data<T>();
      const T* x = a.data<T>();
      const T* y = b.data<T>();
      for (std::int64_t i = 0, m = out.numel(); i < m; ++i) o[i] = x[i] - y[i];
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      T* o = out.data<T>();
      const T* x = a.data<T>();
      const T* y = b.data<T>();
      for (std::int64_t i = 0, m = out.numel(); i < m; ++i) o[i] = T(float(x[i]) - float(y[i]));
    } else {
      throw TypeError(kOp, "expected a floating-point tensor, got " + out.str());
    }
  });
}

/// torch 1.13's CPU lerp with a scalar weight: self + w * (end - self) for
/// |w| < 0.5, else end - (1 - w) * (end - self), each as one fused multiply-add.
template <class T>
T lerp1(T self, T end, T w) {
  return std::abs(w) < T(0.5) ? std::fma(w, end - self, self) : std::fma(w - T(1), end - self, end);
}

/// param <- lerp(global, param, alpha), elementwise. alpha 0 is a copy of
/// global: fma(0, x, g) == g for every finite x (torch gives NaN where the
/// local value is infinite; the copy keeps the global value).
void lerp_into_param(const Tensor& param, const Tensor& global, double alpha) {
  if (alpha == 0.0) {
    param.copy_(global);
    return;
  }
  dispatch_dtype(param.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      T* p = param.data<T>();
      const T* g = global.data<T>();
      const T w = static_cast<T>(alpha);
      for (std::int64_t i = 0, m = param.numel(); i < m; ++i) p[i] = lerp1<T>(g[i], p[i], w);
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      T* p = param.data<T>();
      const T* g = global.data<T>();
      const float w = static_cast<float>(alpha);
      for (std::int64_t i = 0, m = param.numel(); i < m; ++i) p[i] = T(lerp1<float>(float(g[i]), float(p[i]), w));
    } else {
      throw TypeError(kOp, "expected a floating-point tensor, got " + param.str());
    }
  });
}

/// Copies the elements of t (any float dtype) into dst as float32.
void to_float(const Tensor& t, float* dst) {
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* s = t.data<T>();
    for (std::int64_t i = 0, m = t.numel(); i < m; ++i) dst[i] = static_cast<float>(to_double(s[i]));
  });
}
void from_float(const float* src, const Tensor& t) {
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* d = t.data<T>();
    for (std::int64_t i = 0, m = t.numel(); i < m; ++i) {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) d[i] = T(src[i]);
      else d[i] = static_cast<T>(src[i]);
    }
  });
}

std::string fragments_str(const std::vector<std::vector<std::int64_t>>& f) {
  std::string s;
  for (std::size_t k = 0; k < f.size(); ++k) {
    if (k) s += ';';
    for (std::size_t j = 0; j < f[k].size(); ++j) s += (j ? "," : "") + std::to_string(f[k][j]);
  }
  return s;
}

std::int64_t parse_int(const std::string& s, const char* what) {
  return detail::parse_count(s, "DiLoCoAverager.load_state", what);
}

}  // namespace

struct DiLoCoAverager::Pending {
  std::size_t fragment = 0;
  std::vector<Tensor> deltas;  // one per fragment parameter, in its dtype; the averages once done
  Future<void> future;         // float32 wire: the all_reduce_coalesced calls
  Tensor flat;                 // quantized wire: the float32 buffer
  std::thread worker;          // quantized wire: runs quantized_all_reduce
  std::exception_ptr error;
  bool done = false;
};

DiLoCoAverager::DiLoCoAverager(std::vector<Tensor> params, DiLoCoOptions options, ProcessGroup process_group)
    : ModelAverager(std::move(process_group), kOp),
      options_(std::move(options)),
      params_(std::move(params)) {
  dopt::detail::CallScope call_scope("DiLoCoAverager::DiLoCoAverager()");
  const auto n = static_cast<std::int64_t>(params_.size());
  if (params_.empty()) throw ValueError(kOp, "got an empty parameter list");
  std::set<const TensorImpl*> seen_params;
  for (const auto& p : params_) {
    check_defined(p, kOp, "parameter");
    if (!p.device().is_cpu()) throw TypeError(kOp, "parameters must be CPU tensors, got " + p.str());
    if (!is_floating_point(p.dtype())) throw TypeError(kOp, "parameters must be floating point, got " + p.str());
    if (!seen_params.insert(p.key()).second) throw ValueError(kOp, "a parameter is listed twice");
  }
  const DiLoCoOptions& o = options_;
  if (o.sync_every < 1) throw ValueError(kOp, "sync_every must be >= 1, got " + std::to_string(o.sync_every));
  if (o.fragments.empty()) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
    fragments_.push_back(std::move(all));
  } else {
    std::vector<int> count(static_cast<std::size_t>(n), 0);
    for (std::size_t k = 0; k < o.fragments.size(); ++k) {
      if (o.fragments[k].empty()) throw ValueError(kOp, "fragment " + std::to_string(k) + " is empty");
      for (auto i : o.fragments[k]) {
        if (i < 0 || i >= n)
          throw ValueError(kOp, "fragment " + std::to_string(k) + " names parameter " + std::to_string(i) +
                                    ", but there are " + std::to_string(n));
        if (++count[static_cast<std::size_t>(i)] > 1)
          throw ValueError(kOp, "parameter " + std::to_string(i) + " is in more than one fragment");
      }
    }
    for (std::int64_t i = 0; i < n; ++i)
      if (count[static_cast<std::size_t>(i)] == 0)
        throw ValueError(kOp, "parameter " + std::to_string(i) + " is in no fragment");
    fragments_ = o.fragments;
  }
  const auto F = static_cast<std::int64_t>(fragments_.size());
  if (o.sync_every < F || o.sync_every % F != 0)
    throw ValueError(kOp, "sync_every (" + std::to_string(o.sync_every) + ") must be a multiple of the number of "
                              "fragments (" + std::to_string(F) + ")");
  const std::int64_t H = o.sync_every / F;
  if (o.fragment_sync_delay < 0 || o.fragment_sync_delay >= H)
    throw ValueError(kOp, "fragment_sync_delay must be in [0, sync_every / fragments) = [0, " + std::to_string(H) +
                              "), got " + std::to_string(o.fragment_sync_delay));
  if (!(o.fragment_update_alpha >= 0.0 && o.fragment_update_alpha <= 1.0))
    throw ValueError(kOp, "fragment_update_alpha must be in [0, 1], got " + std::to_string(o.fragment_update_alpha));
  if (o.row_size < 1) throw ValueError(kOp, "row_size must be >= 1, got " + std::to_string(o.row_size));
  if (o.wire_format == WireFormat::float32 && o.error_feedback)
    throw ValueError(kOp, "error_feedback needs a quantized wire format (float32 loses nothing)");

  for (const auto& p : params_) anchors_.push_back(p.clone());
  for (const auto& frag : fragments_) {
    std::vector<Tensor> mine;
    for (auto i : frag) mine.push_back(anchors_[static_cast<std::size_t>(i)]);
    std::vector<OptimizerParamGroup> groups;
    groups.emplace_back(std::move(mine));
    outer_.push_back(make_optimizer(o.outer_optimizer, std::move(groups)));
  }
  residuals_.resize(fragments_.size());
  delta_bufs_.resize(fragments_.size());
  flat_bufs_.resize(fragments_.size());
}

DiLoCoAverager::~DiLoCoAverager() {
  settle();
  if (pending_ && pending_->worker.joinable()) pending_->worker.join();
}

void DiLoCoAverager::settle() const {
  if (in_sync_.valid()) {
    in_sync_.wait();  // its error stays with the future (the header)
    in_sync_ = Future<void>();
  }
  if (done_worker_.joinable()) done_worker_.join();
}

std::optional<ProcessGroup> DiLoCoAverager::group_for_step(std::int64_t step) const {
  const std::int64_t H = options_.sync_every / static_cast<std::int64_t>(fragments_.size());
  const std::int64_t l = step % H + 1;
  if (l == H - options_.fragment_sync_delay || l == H) return process_group();
  return std::nullopt;
}

std::optional<std::size_t> DiLoCoAverager::pending_fragment() const noexcept {
  if (!pending_) return std::nullopt;
  return pending_->fragment;
}

DiLoCoStats DiLoCoAverager::stats() const {
  return stats_;
}

void DiLoCoAverager::average_parameters(const std::vector<OptimizerParamGroup>& /*groups*/) {
  dopt::detail::CallScope call_scope("DiLoCoAverager::average_parameters()");
  call(/*background=*/false);
}

Future<void> DiLoCoAverager::average_parameters_async(const std::vector<OptimizerParamGroup>& /*groups*/) {
  dopt::detail::CallScope call_scope("DiLoCoAverager::average_parameters_async()");
  return call(/*background=*/true);
}

Future<void> DiLoCoAverager::call(bool background) {
  settle();
  dopt::detail::fence_wait();  // a background snapshot still copies the parameters or the outer state
  const std::int64_t c = step();
  const auto F = static_cast<std::int64_t>(fragments_.size());
  const std::int64_t H = options_.sync_every / F;
  const std::int64_t l = c % H + 1;
  const auto k = static_cast<std::size_t>((c / H) % F);
  set_step(c + 1);  // the schedule advances also when this call throws
  if (!process_group().is_member()) return make_ready_future();
  if (l == H - options_.fragment_sync_delay) prepare(k);
  if (l == H) return sync(k, background);
  return make_ready_future();
}

void DiLoCoAverager::average_parameters(const std::vector<Tensor>& /*params*/) {
  dopt::detail::CallScope call_scope("DiLoCoAverager::average_parameters()");
  average_parameters(std::vector<OptimizerParamGroup>{});
}

void DiLoCoAverager::prepare(std::size_t k) {
  const auto t0 = Clock::now();
  if (pending_) finish_pending();  // not on the schedule; only after a misuse of set_step
  pending_.reset();
  auto p = std::make_unique<Pending>();
  p->fragment = k;
  const auto& frag = fragments_[k];
  // The fragment's delta buffers are kept from one sync to the next (no
  // fresh allocation, no page faults of a new 4 N-byte buffer every time).
  auto& bufs = delta_bufs_[k];
  if (bufs.empty())
    for (auto i : frag) {
      const Tensor& param = params_[static_cast<std::size_t>(i)];
      bufs.push_back(Tensor::empty(param.shape(), param.dtype()));
    }
  for (std::size_t j = 0; j < frag.size(); ++j) {
    const auto i = static_cast<std::size_t>(frag[j]);
    sub_into(bufs[j], anchors_[i], params_[i]);
    p->deltas.push_back(bufs[j]);
  }
  ProcessGroup group = process_group();
  const int n = group.size();
  if (options_.wire_format == WireFormat::float32) {
    // One all_reduce_coalesced per dtype (in order of first appearance), summed
    // in gloo's ring order: what torchft on gloo computes.
    std::vector<DType> kinds;
    for (const auto& d : p->deltas)
      if (std::find(kinds.begin(), kinds.end(), d.dtype()) == kinds.end()) kinds.push_back(d.dtype());
    std::vector<Future<void>> futures;
    for (DType dt : kinds) {
      std::vector<Tensor> members;
      std::uint64_t bytes = 0;
      for (const auto& d : p->deltas)
        if (d.dtype() == dt) {
          members.push_back(d);
          bytes += d.nbytes();
        }
      AllReduceCoalescedOptions ao;
      ao.op = ReduceOp::sum;
      ao.order = ReduceOrder::ring;
      futures.push_back(group.all_reduce_coalesced_async(members, ao));
      // What a ring all-reduce sends per rank: 2 (n - 1) of n equal parts.
      stats_.bytes_sent += bytes * 2 * static_cast<std::uint64_t>(n - 1) / static_cast<std::uint64_t>(n);
    }
    p->future = detail::when_all(std::move(futures));
  } else {
    std::int64_t total = 0;
    for (const auto& d : p->deltas) total += d.numel();
    if (!flat_bufs_[k].defined()) flat_bufs_[k] = Tensor::empty({total}, DType::float32);
    p->flat = flat_bufs_[k];
    std::int64_t off = 0;
    for (const auto& d : p->deltas) {
      to_float(d, p->flat.data<float>() + off);
      off += d.numel();
    }
    Tensor residual;
    if (options_.error_feedback) {
      if (!residuals_[k].defined()) residuals_[k] = Tensor::zeros({total}, DType::float32);
      residual = residuals_[k];
    }
    QuantizedAllReduceOptions qo;
    qo.format = options_.wire_format;
    qo.row_size = options_.row_size;
    qo.tag = options_.wire_tag;
    Promise<void> promise;
    p->future = promise.get_future();
    // Counted here (the worker sends exactly this), so that the count does
    // not depend on when the worker finishes.
    stats_.bytes_sent += quantized_all_reduce_bytes(total, n, group.rank(), qo);
    p->worker = std::thread([group, flat = p->flat, qo, residual, promise = std::move(promise)]() mutable {
      try {
        quantized_all_reduce(group, flat, qo, residual);
        promise.set_value();
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    });
  }
  pending_ = std::move(p);
  stats_.seconds_preparing += seconds_since(t0);
}

void DiLoCoAverager::finish_pending() {
  Pending& p = *pending_;
  if (!p.done) {
    const auto t0 = Clock::now();
    p.future.wait();
    land(p, p.future);
    stats_.seconds_waiting += seconds_since(t0);
  }
  if (p.error) std::rethrow_exception(p.error);
}

void DiLoCoAverager::land(Pending& p, const Future<void>& average) {
  if (p.done) return;
  p.done = true;
  try {
    average.get();
  } catch (...) {
    p.error = std::current_exception();
  }
  if (p.worker.joinable()) {
    // The continuation of a quantized average runs on that worker: the rank thread joins it (settle).
    if (p.worker.get_id() == std::this_thread::get_id()) done_worker_ = std::move(p.worker);
    else p.worker.join();
  }
  if (p.error) return;
  const int n = process_group().size();
  if (options_.wire_format == WireFormat::float32) {
    for (const auto& d : p.deltas) detail::divide_(d, n, kOp);  // sum first, then divide
  } else {
    std::int64_t off = 0;  // quantized_all_reduce has divided already
    for (const auto& d : p.deltas) {
      from_float(p.flat.data<float>() + off, d);
      off += d.numel();
    }
  }
}

Future<void> DiLoCoAverager::sync(std::size_t k, bool background) {
  if (!pending_ || pending_->fragment != k) prepare(k);  // e.g. after set_step to a sync step
  const auto t0 = Clock::now();
  if (!background) {
    complete_sync(k, pending_->future, t0);  // waits here, throws here
    return make_ready_future();
  }
  in_sync_ = pending_->future.then([this, k, t0](const Future<void>& average) { complete_sync(k, average, t0); });
  return in_sync_;
}

void DiLoCoAverager::complete_sync(std::size_t k, const Future<void>& average, Clock::time_point t0) {
  const auto& frag = fragments_[k];
  Pending& pending = *pending_;
  if (!pending.done) {
    land(pending, average);
    stats_.seconds_waiting += seconds_since(t0);
  }
  if (pending.error) {
    // The fragment returns to its anchor; anchors and outer state stay.
    for (auto i : frag) params_[static_cast<std::size_t>(i)].copy_(anchors_[static_cast<std::size_t>(i)]);
    const std::exception_ptr error = pending.error;
    pending_.reset();
    ++stats_.failed_syncs;
    std::rethrow_exception(error);
  }
  std::unique_ptr<Pending> p = std::move(pending_);
  for (std::size_t j = 0; j < frag.size(); ++j) anchors_[static_cast<std::size_t>(frag[j])].set_grad(p->deltas[j]);
  outer_[k]->step();
  for (std::size_t j = 0; j < frag.size(); ++j) {
    const auto i = static_cast<std::size_t>(frag[j]);
    anchors_[i].set_grad(Tensor());
    lerp_into_param(params_[i], anchors_[i], options_.fragment_update_alpha);
  }
  ++stats_.syncs;
}

void DiLoCoAverager::save_state(StateDict& sd) const {
  save_into(sd, !sharded_, true, 0, 1);
  if (sharded_) sd.metadata[kShardedMeta] = "1";
}

void DiLoCoAverager::save_into(StateDict& sd, bool replicated, bool local, int shard, int shards) const {
  settle();
  auto* self = const_cast<DiLoCoAverager*>(this);
  if (pending_) self->finish_pending();  // the average in flight is part of the state
  auto mine = [&](std::int64_t i) { return i % shards == shard; };
  if (replicated)
    for (std::size_t i = 0; i < anchors_.size(); ++i)
      if (mine(static_cast<std::int64_t>(i))) sd.state[static_cast<std::int64_t>(i)][kAnchorKey] = anchors_[i].clone();
  for (std::size_t k = 0; k < fragments_.size(); ++k) {
    if (replicated) {
      const StateDict osd = outer_[k]->state_dict();
      for (const auto& [idx, st] : osd.state) {
        const std::int64_t i = fragments_[k][static_cast<std::size_t>(idx)];
        if (!mine(i)) continue;
        for (const auto& [key, t] : st)
          if (t.defined()) sd.state[i][kOuterPrefix + key] = t.clone();
      }
      sd.metadata[kOuterMetaPrefix + std::to_string(k)] =
          OptimizerSpec{outer_[k]->name(), osd.param_groups.at(0).hyperparams}.to_json();
    }
    if (local && residuals_[k].defined()) {
      std::int64_t off = 0;
      for (auto i : fragments_[k]) {
        const Tensor& p = params_[static_cast<std::size_t>(i)];
        sd.state[i][kResidualKey] = residuals_[k].flat_slice(off, p.numel()).clone().view(p.shape());
        off += p.numel();
      }
    }
  }
  if (replicated && pending_) {
    const auto& frag = fragments_[pending_->fragment];
    for (std::size_t j = 0; j < frag.size(); ++j)
      if (mine(frag[j])) sd.state[frag[j]][kPendingKey] = pending_->deltas[j].clone();
    sd.metadata[kPendingMeta] = std::to_string(pending_->fragment);
  }
  sd.metadata[kFormatMeta] = "1";
  sd.metadata[kFragmentsMeta] = fragments_str(fragments_);
  sd.metadata[kSyncsMeta] = std::to_string(stats_.syncs);
}

void DiLoCoAverager::load_state(StateDict& sd) {
  // A dict saved with sharded checkpoints holds only this rank's own part
  // (residuals); load_sharded restores the rest.
  const bool sharded = sd.metadata.count(kShardedMeta) > 0;
  load_from(sd, !sharded, true);
}

void DiLoCoAverager::load_from(StateDict& sd, bool replicated, bool local) {
  settle();
  static constexpr const char* op = "DiLoCoAverager.load_state";
  if (!sd.metadata.count(kFormatMeta))
    throw StateDictError(op, "the state dict holds no DiLoCo state (no metadata '" + std::string(kFormatMeta) +
                                 "'): it was not saved with a DiLoCoAverager");
  if (sd.metadata.at(kFormatMeta) != "1")
    throw StateDictError(op, "unknown DiLoCo state format '" + sd.metadata.at(kFormatMeta) + "'");
  const std::string frags = sd.metadata.count(kFragmentsMeta) ? sd.metadata.at(kFragmentsMeta) : "";
  if (frags != fragments_str(fragments_))
    throw StateDictError(op, "the state dict's fragments '" + frags + "' differ from this averager's '" +
                                 fragments_str(fragments_) + "'");
  auto entry = [&](std::int64_t i, const std::string& key, bool required) -> Tensor {
    auto it = sd.state.find(i);
    if (it == sd.state.end() || !it->second.count(key)) {
      if (required)
        throw StateDictError(op, "parameter " + std::to_string(i) + " has no '" + key + "' in the state dict");
      return Tensor();
    }
    Tensor t = it->second.at(key);
    const Tensor& p = params_[static_cast<std::size_t>(i)];
    if (t.numel() != p.numel())
      throw StateDictError(op, "'" + key + "' of parameter " + std::to_string(i) + " is " + t.str() +
                                   ", the parameter " + p.str());
    return t;
  };
  // Everything is checked and staged before anything changes.
  std::vector<Tensor> anchors;
  if (replicated)
    for (std::size_t i = 0; i < params_.size(); ++i)
      anchors.push_back(entry(static_cast<std::int64_t>(i), kAnchorKey, true));
  std::vector<StateDict> outer(fragments_.size());
  for (std::size_t k = 0; k < fragments_.size() && replicated; ++k) {
    const std::string mk = kOuterMetaPrefix + std::to_string(k);
    if (!sd.metadata.count(mk)) throw StateDictError(op, "no metadata '" + mk + "'");
    const OptimizerSpec spec = OptimizerSpec::from_json(sd.metadata.at(mk));
    if (spec.name != outer_[k]->name())
      throw StateDictError(op, "fragment " + std::to_string(k) + "'s outer optimizer was " + spec.name + ", is " +
                                   outer_[k]->name());
    StateDict::Group g;
    g.hyperparams = spec.hyperparameters;
    for (std::size_t j = 0; j < fragments_[k].size(); ++j) {
      g.params.push_back(static_cast<std::int64_t>(j));
      auto it = sd.state.find(fragments_[k][j]);
      if (it == sd.state.end()) continue;
      for (const auto& [key, t] : it->second)
        if (key.rfind(kOuterPrefix, 0) == 0) outer[k].state[static_cast<std::int64_t>(j)][key.substr(std::string(kOuterPrefix).size())] = t;
    }
    outer[k].param_groups.push_back(std::move(g));
  }
  std::optional<std::size_t> pending_k;
  if (replicated && sd.metadata.count(kPendingMeta)) {
    const auto v = parse_int(sd.metadata.at(kPendingMeta), "the pending fragment");
    if (v >= static_cast<std::int64_t>(fragments_.size()))
      throw StateDictError(op, "the pending fragment " + std::to_string(v) + " does not exist");
    pending_k = static_cast<std::size_t>(v);
  }
  std::vector<Tensor> pending_deltas;
  if (pending_k)
    for (auto i : fragments_[*pending_k]) pending_deltas.push_back(entry(i, kPendingKey, true));
  std::int64_t syncs = stats_.syncs;
  if (sd.metadata.count(kSyncsMeta)) syncs = parse_int(sd.metadata.at(kSyncsMeta), "the sync count");

  // Apply.
  if (replicated && pending_) {
    try {
      finish_pending();
    } catch (...) {
    }
    pending_.reset();
  }
  if (replicated) {
    for (std::size_t i = 0; i < params_.size(); ++i)
      anchors_[i].copy_(anchors[i].to(anchors_[i].dtype()).view(anchors_[i].shape()));
    for (std::size_t k = 0; k < fragments_.size(); ++k) outer_[k]->load_state_dict(outer[k]);
  }
  for (std::size_t k = 0; k < fragments_.size() && local; ++k) {
    residuals_[k] = Tensor();
    std::int64_t total = 0;
    for (auto i : fragments_[k]) total += params_[static_cast<std::size_t>(i)].numel();
    bool any = false;
    Tensor r = Tensor::zeros({total}, DType::float32);
    std::int64_t off = 0;
    for (auto i : fragments_[k]) {
      const Tensor t = entry(i, kResidualKey, false);
      const std::int64_t m = params_[static_cast<std::size_t>(i)].numel();
      if (t.defined()) {
        r.flat_slice(off, m).copy_(t.to(DType::float32).view({m}));
        any = true;
      }
      off += m;
    }
    if (any) residuals_[k] = r;
  }
  if (pending_k) {
    auto p = std::make_unique<Pending>();
    p->fragment = *pending_k;
    for (std::size_t j = 0; j < pending_deltas.size(); ++j) {
      const Tensor& param = params_[static_cast<std::size_t>(fragments_[*pending_k][j])];
      p->deltas.push_back(pending_deltas[j].to(param.dtype()).view(param.shape()).clone());
    }
    p->done = true;
    pending_ = std::move(p);
  }
  stats_.syncs = syncs;
  // Remove what was ours; the rest belongs to the local optimizer.
  for (auto it = sd.state.begin(); it != sd.state.end();) {
    for (auto e = it->second.begin(); e != it->second.end();) {
      if (e->first.rfind("diloco.", 0) == 0) e = it->second.erase(e);
      else ++e;
    }
    if (it->second.empty()) it = sd.state.erase(it);
    else ++it;
  }
  for (auto it = sd.metadata.begin(); it != sd.metadata.end();) {
    if (it->first.rfind("diloco.", 0) == 0) it = sd.metadata.erase(it);
    else ++it;
  }
}

std::string DiLoCoAverager::shard_file_name(int rank, int world_size) {
  return "diloco-rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

void DiLoCoAverager::save_sharded(const std::string& dir) const {
  const int n = process_group().size(), r = process_group().rank();
  StateDict sd;
  save_into(sd, true, false, r, n);
  sd.metadata[kShardsMeta] = std::to_string(n);
  StateDict::Group g;  // every index is listed, so that the file is a valid state dict
  for (std::size_t i = 0; i < params_.size(); ++i) g.params.push_back(static_cast<std::int64_t>(i));
  sd.param_groups.push_back(std::move(g));
  save_state_dict(sd, (std::filesystem::path(dir) / shard_file_name(r, n)).string());
}

void DiLoCoAverager::load_sharded(const std::string& dir) {
  static constexpr const char* op = "DiLoCoAverager.load_sharded";
  // The number of shards: from the first file found (shard 0 of some size).
  std::optional<int> shards;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("diloco-rank0-of-", 0) == 0) {
      const std::string rest = name.substr(16);
      shards = static_cast<int>(parse_int(rest.substr(0, rest.find('.')), "the shard count"));
      break;
    }
  }
  if (!shards || *shards < 1) throw StateDictError(op, dir + ": no DiLoCo shard (diloco-rank0-of-N.safetensors)");
  StateDict merged;
  for (int s = 0; s < *shards; ++s) {
    const std::string file = (std::filesystem::path(dir) / shard_file_name(s, *shards)).string();
    StateDict part = dopt::load_state_dict(file);  // IOError / StateDictError name the file
    if (!part.metadata.count(kShardsMeta) || part.metadata.at(kShardsMeta) != std::to_string(*shards))
      throw StateDictError(op, file + ": not shard " + std::to_string(s) + " of " + std::to_string(*shards));
    for (auto& [i, st] : part.state)
      for (auto& [key, t] : st) merged.state[i][key] = t;
    if (s == 0) merged.metadata = part.metadata;
  }
  load_from(merged, true, false);
}

}  // namespace dopt::optim
