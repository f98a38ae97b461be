// ReplayBuddies (zero_buddies.hpp; ZeroBuddyUpdate::replay): each buddy
// saves the averaged gradients of the shards it copies every step and takes
// its owner's state every snapshot_interval steps; at recovery it replays
// the saved steps (contract in zero.hpp, design in docs/fault-tolerance-optimizers.md).
#include <cstring>
#include <unordered_map>

#include "survive/survive_util.hpp"
#include "zero_buddies.hpp"
#include "zero_core.hpp"
#include "zero_wire.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace dopt::optim::zero_detail {
namespace {

/// The tag of the snapshots (ZeroBuddyUpdate::replay) on ZeRO's group; the
/// recovery's messages use tags below the group's size, on a fresh group.
constexpr int kSnapshotTag = 0x5a45524f;  // "ZERO"

/// dst = src (same dtype and size) for a copy that is read only much later
/// (ZeroBuddyUpdate::replay's saved gradients and snapshot parameters): on
/// x86-64, CPU tensors of 1 MiB or more are copied with non-temporal stores,
/// which do not read the destination into the cache nor evict what the step
/// works on (2.6-2.9 ms against memcpy's 3.4-7.7 ms for 50 MB on the 2-core
/// development machine, 2026-12-04). Anything else: Tensor::copy_.
void copy_for_later(const Tensor& dst, const Tensor& src) {
#if defined(__x86_64__) || defined(_M_X64)
  const std::size_t n = dst.nbytes();
  if (dst.device().is_cpu() && src.device().is_cpu() && dst.dtype() == src.dtype() && src.nbytes() == n &&
      n >= (std::size_t{1} << 20)) {
    auto* d = static_cast<char*>(dst.data_ptr());
    const auto* s = static_cast<const char*>(src.data_ptr());
    const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    std::size_t i = head;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, n - i);
    _mm_sfence();
    return;
  }
#endif
  dst.copy_(src);
}

}  // namespace

void ReplayBuddies::reset_snapshots(const ZeroCore& z) {
  for (auto& [target, log] : logs_) {
    const auto ps = z.part.shard(target);
    log.params.clear();
    for (const auto& p : ps) log.params.push_back(p.clone());
    for (auto& sv : log.saved) log.spare.push_back(std::move(sv.grads));
    log.saved.clear();
  }
}

void ReplayBuddies::save_grads(const ZeroCore& z, int only) {
  for (auto& [target, log] : logs_) {
    if (only >= 0 && target != only) continue;
    const auto ps = z.part.shard(target);
    Log::Saved sv;
    std::vector<Tensor> buf;
    if (!log.spare.empty()) {
      buf = std::move(log.spare.back());
      log.spare.pop_back();
    }
    buf.resize(ps.size());
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const Tensor g = ps[i].grad();
      if (!g.defined()) {
        sv.grads.emplace_back();
        continue;
      }
      Tensor& b = buf[i];
      if (!b.defined() || b.dtype() != g.dtype() || b.shape() != g.shape() || b.device() != g.device())
        b = Tensor::empty(g.shape(), g.dtype(), g.device());
      copy_for_later(b, g);
      sv.grads.push_back(b);
    }
    for (const auto& g : z.params.groups()) sv.options.push_back(g.options->clone());
    log.saved.push_back(std::move(sv));
  }
}

std::vector<Future<void>> ReplayBuddies::post_snapshot(ZeroCore& z) {
  std::vector<Future<void>> out;
  const auto& bs = table_[static_cast<std::size_t>(z.rank)];
  if (bs.empty()) return out;
  std::vector<Entry> entries;
  std::vector<Tensor> tensors;
  for (const auto& p : z.part.shard(z.rank)) {
    auto it = z.optim->state().find(p.key());
    if (it == z.optim->state().end()) continue;
    for (const auto& [key, t] : it->second) {
      if (!t.defined()) continue;
      entries.push_back(Entry{z.params.index_of(p), key, t.dtype(), t.shape()});
      tensors.push_back(t);
    }
  }
  const std::string text = describe(entries);
  for (int b : bs) {
    post_string(z.group, text, b, kSnapshotTag, out);
    for (const auto& t : tensors) out.push_back(z.group.send_async(t, b, kSnapshotTag));
  }
  return out;
}

void ReplayBuddies::finish_snapshot(ZeroCore& z, std::vector<Future<void>>& sends) {
  std::exception_ptr other;  // an error that is not a lost peer
  auto keep = [&](std::exception_ptr e) {
    if (!other && !detail::is_peer_lost(e)) other = std::move(e);
  };
  for (auto& [target, log] : logs_) {
    std::vector<Entry> entries;
    std::vector<Tensor> tensors;
    std::vector<Future<void>> recvs;
    bool failed = false;
    try {
      entries = parse(recv_string(z.group, target, kSnapshotTag));
      // Into the buffers the previous snapshot freed, where they fit: fresh
      // memory costs a page fault per 4 KiB (70-170 ms per 50 MB on the
      // development machine, more than the copy itself).
      for (std::size_t j = 0; j < entries.size(); ++j) {
        const auto& e = entries[j];
        const Device dev = z.params.at(static_cast<std::size_t>(e.index)).device();
        Tensor t = j < log.incoming.size() ? log.incoming[j] : Tensor();
        if (!t.defined() || t.dtype() != e.dtype || t.shape() != e.shape || t.device() != dev)
          t = Tensor::empty(e.shape, e.dtype, dev);
        tensors.push_back(t);
        recvs.push_back(z.group.recv_async(tensors.back(), target, kSnapshotTag));
      }
    } catch (...) {
      failed = true;
      keep(std::current_exception());
    }
    std::exception_ptr first;
    for (auto& w : recvs) wait_keeping_first_error(w, first);
    if (first) keep(first);
    if (failed || first) {
      // Dropped: the older snapshot stays (its buffers were not used), and
      // this step joins the saved ones (step() saves none at a snapshot).
      save_grads(z, target);
      continue;
    }
    // The new state in; the old state's tensors (in the same order) are the
    // next snapshot's buffers.
    auto& state = copies_.at(target)->state();
    std::unordered_map<const TensorImpl*, ParamState> st;
    log.incoming.assign(entries.size(), Tensor());
    for (std::size_t j = 0; j < entries.size(); ++j) {
      const TensorImpl* k = z.params.at(static_cast<std::size_t>(entries[j].index)).key();
      st[k][entries[j].key] = tensors[j];
      auto it = state.find(k);
      if (it == state.end()) continue;
      auto old = it->second.find(entries[j].key);
      if (old != it->second.end() && !old->second.is_same(tensors[j])) log.incoming[j] = old->second;
    }
    state = std::move(st);
    const auto ps = z.part.shard(target);
    for (std::size_t i = 0; i < ps.size() && i < log.params.size(); ++i) copy_for_later(log.params[i], ps[i]);
    for (auto& sv : log.saved) log.spare.push_back(std::move(sv.grads));
    log.saved.clear();
  }
  std::exception_ptr first;
  for (auto& w : sends) wait_keeping_first_error(w, first);
  sends.clear();
  if (first) keep(first);
  if (other) std::rethrow_exception(other);
}

void ReplayBuddies::replay(ZeroCore& z, int target) {
  auto it = logs_.find(target);
  if (it == logs_.end() || it->second.saved.empty()) return;
  Log& log = it->second;
  Optimizer& copy = *copies_.at(target);
  const auto ps = z.part.shard(target);
  std::vector<Tensor> grads;  // the caller's, put back after
  for (std::size_t i = 0; i < ps.size(); ++i) {
    grads.push_back(ps[i].grad());
    ps[i].copy_(log.params[i]);
  }
  for (auto& sv : log.saved) {
    for (std::size_t i = 0; i < ps.size(); ++i) ps[i].set_grad(sv.grads[i]);
    auto& gs = copy.param_groups();
    for (std::size_t g = 0; g < sv.options.size() && g < gs.size(); ++g) gs[g].options = sv.options[g]->clone();
    copy.step();
  }
  for (std::size_t i = 0; i < ps.size(); ++i) {
    ps[i].set_grad(grads[i]);
    log.params[i].copy_(ps[i]);
  }
  for (auto& sv : log.saved) log.spare.push_back(std::move(sv.grads));
  log.saved.clear();
}

// --- the Redundancy and recovery points -----------------------------------------

void ReplayBuddies::make_copies(ZeroCore& z) {
  CopyBuddies::make_copies(z);
  logs_.clear();
  for (const auto& [target, copy] : copies_) logs_[target];
  reset_snapshots(z);
}

void ReplayBuddies::install_state(ZeroCore& z, StateByParam local) {
  CopyBuddies::install_state(z, std::move(local));
  reset_snapshots(z);  // the loaded state is the copies' snapshot
}

std::int64_t ReplayBuddies::copy_bytes() const {
  std::int64_t b = CopyBuddies::copy_bytes();
  auto add = [&](const std::vector<Tensor>& ts) {
    for (const auto& t : ts)
      if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  };
  for (const auto& [r, log] : logs_) {
    add(log.params);
    add(log.incoming);
    for (const auto& sv : log.saved) add(sv.grads);
    for (const auto& sp : log.spare) add(sp);
  }
  return b;
}

std::optional<ZeroRecovery> ReplayBuddies::finish_step(ZeroCore& z, Future<void>& notify) {
  // The buddies save this step's gradients while the broadcasts are in
  // flight (the broadcasts write parameters, not gradients). Every
  // snapshot_interval-th step ends with a snapshot of each owner's state at
  // its buddies (posted now, received after the broadcasts) instead: its
  // gradients are saved only where the snapshot does not arrive (then the
  // copy replays from the older one), or when the step is lost before.
  const bool snapshot = (z.steps + 1) % interval_ == 0;
  std::vector<Future<void>> snapshot_sends;
  bool saved = false;
  try {
    if (snapshot) snapshot_sends = post_snapshot(z);
    std::function<void()> save;
    if (!snapshot)
      save = [&] {
        save_grads(z);
        saved = true;
      };
    sync_shards(z, save);
    notify.get();
    if (snapshot) {
      z.probe_at("snapshot", 0);
      saved = true;  // from here on by finish_snapshot, copy by copy
      finish_snapshot(z, snapshot_sends);
    }
    ++z.steps;
    return std::nullopt;
  } catch (const PeerLostError&) {
    snapshot_sends.clear();  // on the old group; the recovery snapshots every copy anew
    if (!saved) save_grads(z);  // lost before they were saved (or before a snapshot)
  }
  return recover_from_loss(z, /*in_step=*/true);
}

void ReplayBuddies::lost_shards(ZeroCore& z, const Loss& loss, bool) {
  // The buddy that holds a lost owner's shard now first brings its copy
  // (state and the shard's parameters) up to date.
  for (std::size_t o = 0; o < loss.new_rank.size(); ++o)
    if (loss.new_rank[o] < 0 && loss.source[o] == loss.me) replay(z, static_cast<int>(o));
}

bool ReplayBuddies::kept_before(const Loss& loss, int o, int r) const {
  if (loss.new_rank[static_cast<std::size_t>(o)] == r) return true;
  return loss.source[static_cast<std::size_t>(o)] == r;  // other copies are from a snapshot
}

void ReplayBuddies::add_available(const Loss& loss, StateByParam& avail) const {
  for (const auto& [t, copy] : copies_) {
    const auto ut = static_cast<std::size_t>(t);
    if (!(loss.new_rank[ut] < 0 && loss.source[ut] == loss.me)) continue;  // a snapshot's state, not the owner's now
    for (const auto& [k, st] : copy->state()) avail[k] = st;
  }
}

}  // namespace dopt::optim::zero_detail
