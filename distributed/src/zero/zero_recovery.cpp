// Buddies::recover_from_loss (zero_buddies.hpp): the recovery from lost
// ranks, common to the buddy modes, which it asks at fixed points (the
// hooks of Buddies). Contract in zero.hpp; design in docs/fault-tolerance-optimizers.md.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/settings.hpp"
#include "survive/agreement.hpp"
#include "zero_buddies.hpp"
#include "zero_core.hpp"
#include "zero_internal.hpp"
#include "zero_wire.hpp"

namespace dopt::optim::zero_detail {
namespace {

constexpr const char* kRecover = "ZeroRedundancyOptimizer.recover";

std::string list_str(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

/// DOPT_ZERO_TRACE=1: the recovery's phases, timed, as notices (for the
/// benchmark's breakdown; docs/performance.md).
class PhaseTrace {
 public:
  PhaseTrace() {
    on_ = settings::flag("DOPT_ZERO_TRACE").value_or(false);
    last_ = std::chrono::steady_clock::now();
    cpu_ = cpu_ms();
    if (on_)
      notice("ZeroRedundancyOptimizer recovery starts at steady clock " +
             std::to_string(last_.time_since_epoch().count()) + " ns");
  }
  void mark(const char* phase, int rank) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    const double cpu = cpu_ms();
    char buf[200];
    std::snprintf(buf, sizeof buf, "ZeroRedundancyOptimizer recovery [rank %d]: %s %.1f ms (process CPU %.1f ms)",
                  rank, phase, std::chrono::duration<double, std::milli>(now - last_).count(), cpu - cpu_);
    notice(buf);
    last_ = now;
    cpu_ = cpu;
  }

 private:
  static double cpu_ms() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    auto ms = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_usec) / 1e3; };
    return ms(u.ru_utime) + ms(u.ru_stime);
  }
  bool on_ = false;
  std::chrono::steady_clock::time_point last_;
  double cpu_ = 0;
};

/// broadcast_coalesced of CPU tensors, one by one otherwise.
void broadcast_all(ProcessGroup& g, const std::vector<Tensor>& ts, int src) {
  if (ts.empty()) return;
  const bool cpu = std::all_of(ts.begin(), ts.end(), [](const Tensor& t) { return t.device().is_cpu(); });
  if (cpu) return g.broadcast_coalesced(ts, src);
  for (const auto& t : ts) g.broadcast(t, src);
}


}  // namespace

bool Buddies::kept_before(const Loss& loss, int o, int r) const {
  if (loss.new_rank[static_cast<std::size_t>(o)] == r) return true;
  for (int b : loss.old_table[static_cast<std::size_t>(o)])
    if (loss.new_rank[static_cast<std::size_t>(b)] == r) return true;
  return false;
}

void Buddies::commit_buckets(ZeroCore& z, const Loss& loss, bool same_trainable, const std::vector<Kind>& kinds,
                             const std::vector<std::vector<std::vector<Tensor>>>& moved, bool) {
  if (!z.bucket_view) return;
  if (same_trainable) z.buckets.keep_and_add(loss.new_rank, z.world, kinds, moved, z.rank, z.repoint, nullptr);
  else z.buckets.build(z.part, z.rank, z.repoint);
}

ZeroRecovery Buddies::recover_from_loss(ZeroCore& z, bool in_step) {
  const std::string op = in_step ? std::string("ZeroRedundancyOptimizer.step") : std::string(kRecover);
  const int old_world = z.world;
  const int old_rank = z.rank;
  const int old_k = k(z.world);
  const std::vector<int> old_members = z.group.ranks();
  const Partition old_partition = z.part;
  const auto old_table = table_;
  std::vector<std::vector<std::int64_t>> shard(static_cast<std::size_t>(old_world));  // global indices, old order
  for (int o = 0; o < old_world; ++o)
    for (const auto& p : old_partition.shard(o)) shard[static_cast<std::size_t>(o)].push_back(z.params.index_of(p));

  // A further loss while recovering: start again from the old group (the
  // survivors' group then leaves that rank out too). Nothing of this rank's
  // state changes before the end, except that a replayed copy is brought up
  // to date (the same bits whenever it is done; a retry finds nothing saved),
  // and host memory's rebuilds, kept over the tries.
  begin_recovery();
  for (;;) {
    try {
      PhaseTrace trace;
      ShrinkResult sr = z.group.shrink();
      trace.mark("shrink", old_rank);
      ProcessGroup ng = sr.group;
      const int nw = ng.size(), me = ng.rank();
      ZeroRecovery rec;
      rec.group = ng;
      rec.lost = sr.lost;
      rec.new_rank = sr.new_rank;
      rec.step = z.steps;

      // 1. Every survivor stopped at the same step, in the same place.
      const auto where = ::dopt::optim::detail::all_gather_descriptors(ng, {z.steps, in_step ? 1 : 0});
      for (int r = 1; r < nw; ++r)
        if (!where.same(static_cast<std::size_t>(r), 0)) {
          auto at = [&](int g) {
            const auto& w = where[static_cast<std::size_t>(g)];
            return "rank " + std::to_string(ng.global_rank(g)) + " at step " + std::to_string(w[0]) +
                   (w[1] ? " (inside step())" : " (outside step())");
          };
          throw StateError(op, "the survivors stopped at different points (" + at(0) + ", " + at(r) +
                                   "); recovery needs them to stop in the same call. Fall back to the last "
                                   "checkpoint",
                           old_rank);
        }

      // 2. Where each shard's state is now: its owner, else its first surviving buddy.
      Loss loss;
      loss.new_rank = sr.new_rank;
      loss.old_table = old_table;
      loss.old_owner = old_partition.owners();
      loss.me = me;
      loss.source.assign(static_cast<std::size_t>(old_world), -1);  // new group rank
      std::string gone;
      for (int o = 0; o < old_world; ++o) {
        const auto uo = static_cast<std::size_t>(o);
        if (sr.new_rank[uo] >= 0) {
          loss.source[uo] = sr.new_rank[uo];
          continue;
        }
        const auto& bs = old_table[uo];
        for (int b : bs)
          if (sr.new_rank[static_cast<std::size_t>(b)] >= 0) {
            loss.source[uo] = sr.new_rank[static_cast<std::size_t>(b)];
            break;
          }
        if (loss.source[uo] >= 0 || shard[uo].empty()) continue;
        std::int64_t elems = 0;
        std::vector<int> idx;
        for (auto i : shard[uo]) {
          elems += z.params.at(static_cast<std::size_t>(i)).numel();
          idx.push_back(static_cast<int>(i));
        }
        std::vector<int> gb;
        for (int b : bs) gb.push_back(old_members[static_cast<std::size_t>(b)]);
        gone += std::string(gone.empty() ? "" : "; ") + "the optimizer state of rank " +
                std::to_string(old_members[uo]) + "'s shard (" + std::to_string(shard[uo].size()) +
                " parameters, " + std::to_string(elems) + " elements: global indices " + list_str(idx) +
                ") is gone: rank " + std::to_string(old_members[uo]) +
                (gb.empty() ? std::string(" had no buddy") : " and its buddies (rank(s) " + list_str(gb) + ")") +
                " were lost (redundancy " + std::to_string(old_k) + ")";
      }
      if (!gone.empty())
        throw ShardLostError(op, gone + ". Fall back to the last checkpoint: a new ZeroRedundancyOptimizer over "
                                        "the survivors' group (error.recovery().group), load_sharded(dir), and "
                                        "the model's parameters from its own checkpoint",
                             rec, old_rank);

      // The mode brings what this rank holds of each lost shard up to date
      // (replay: the holder replays its copy; host memory: every rank that
      // maps the lost owner's segment rebuilds the shard from it).
      lost_shards(z, loss, in_step);

      trace.mark("agreement and replay", old_rank);
      // 3. The step in flight: each shard's parameters from its holder (the
      //    owner, or the buddy that stepped its copy in the same step), but
      //    where every survivor rebuilt the same values.
      if (in_step)
        for (int o = 0; o < old_world; ++o) {
          if (rebuilt_everywhere(loss, o, old_world)) continue;
          broadcast_all(ng, old_partition.shard(o), loss.source[static_cast<std::size_t>(o)]);
        }

      trace.mark("step in flight broadcast", old_rank);
      // 4. The partition over the survivors: each keeps what it owned, the
      //    lost ranks' parameters are shared out; every state tensor goes to
      //    its new owner and buddies (where it is not already).
      z.world = nw;
      z.rank = me;
      z.part = Partition::keeping(old_partition, sr.new_rank, nw, z.params.weights(z.weight), z.params);
      const auto new_table = table_of(ng.ranks());
      // The parameters each survivor takes over from lost ranks, by kind
      // (device, dtype) in order of first appearance: one more row of buckets.
      std::vector<Kind> kinds;
      std::vector<std::vector<std::vector<Tensor>>> moved(static_cast<std::size_t>(nw));  // [rank][kind]
      for (int r = 0; r < nw; ++r)
        for (const auto& p : z.part.shard(r)) {
          const int was = old_partition.owner(static_cast<std::size_t>(z.params.index_of(p)));
          if (sr.new_rank[static_cast<std::size_t>(was)] >= 0 || !p.requires_grad()) continue;
          const std::size_t k = Buckets::kind_index(kinds, p);
          auto& mr = moved[static_cast<std::size_t>(r)];
          if (mr.size() <= k) mr.resize(k + 1);
          mr[k].push_back(p);
        }
      const bool same_trainable = z.params.trainable_mask() == z.trainable;
      // With other trainable parameters the mode lays out anew (host memory: one segment anew).
      const bool keep_anew = !same_trainable;
      if (prepare(z, ng, new_table, kinds, moved, loss, keep_anew)) trace.mark("new segments", old_rank);

      const bool copies = buddies_hold_copies();
      auto held_by = [&](std::size_t i, int r) {
        const int o = z.part.owner(i);
        if (o == r) return true;
        if (!copies) return false;
        const auto& bs = new_table[static_cast<std::size_t>(o)];
        return std::find(bs.begin(), bs.end(), r) != bs.end();
      };
      StateByParam avail;
      for (const auto& [k, st] : z.optim->state()) avail[k] = st;
      add_available(loss, avail);
      // Point to point: the holder sends each rank only the state of the
      // parameters it keeps from now on (as new owner or buddy); a survivor
      // that kept the shard before (its owner, or a buddy whose copy is up to
      // date: the same bytes as the holder's) needs nothing. Every holder
      // posts all its sends first, then every rank takes its shards in order
      // (no send waits, so nothing waits in a cycle, and every rank's plane
      // moves bytes at once).
      std::vector<std::vector<int>> receivers(static_cast<std::size_t>(old_world));
      for (int o = 0; o < old_world; ++o) {
        const auto uo = static_cast<std::size_t>(o);
        for (int r = 0; r < nw; ++r) {
          bool any = false;
          for (auto i : shard[uo]) any = any || held_by(static_cast<std::size_t>(i), r);
          if (r != loss.source[uo] && any && !kept_before(loss, o, r)) receivers[uo].push_back(r);
        }
      }
      std::vector<Future<void>> sends, recvs;
      for (int o = 0; o < old_world; ++o) {
        const auto uo = static_cast<std::size_t>(o);
        if (loss.source[uo] != me) continue;
        for (int r : receivers[uo]) {
          std::vector<Entry> entries;
          std::vector<Tensor> tensors;
          for (auto i : shard[uo]) {
            if (!held_by(static_cast<std::size_t>(i), r)) continue;
            auto it = avail.find(z.params.at(static_cast<std::size_t>(i)).key());
            if (it == avail.end()) continue;
            for (const auto& [key, t] : it->second) {
              if (!t.defined()) continue;
              entries.push_back(Entry{i, key, t.dtype(), t.shape()});
              tensors.push_back(t);
            }
          }
          post_string(ng, describe(entries), r, /*tag=*/o, sends);
          for (const auto& t : tensors) sends.push_back(ng.send_async(t, r, /*tag=*/o));
        }
      }
      std::vector<Entry> got;
      std::vector<Tensor> into;
      std::exception_ptr first;
      try {
        for (int o = 0; o < old_world; ++o) {
          const auto uo = static_cast<std::size_t>(o);
          const int s = loss.source[uo];
          if (std::find(receivers[uo].begin(), receivers[uo].end(), me) == receivers[uo].end()) continue;
          for (const auto& e : parse(recv_string(ng, s, /*tag=*/o))) {
            got.push_back(e);
            // Host memory: straight into this rank's new segment where it has room for it.
            Tensor in = receive_buffer(e.index, e.key, e.shape, e.dtype);
            into.push_back(in.defined() ? in
                                        : Tensor::empty(e.shape, e.dtype, z.params.at(static_cast<std::size_t>(e.index)).device()));
            recvs.push_back(ng.recv_async(into.back(), s, /*tag=*/o));
          }
        }
      } catch (...) {
        first = std::current_exception();
      }
      for (auto& w : recvs) wait_keeping_first_error(w, first);
      for (auto& w : sends) wait_keeping_first_error(w, first);
      if (first) std::rethrow_exception(first);
      for (std::size_t j = 0; j < got.size(); ++j)
        avail[z.params.at(static_cast<std::size_t>(got[j].index)).key()][got[j].key] = into[j];

      trace.mark("state moved", old_rank);
      // 5. Commit: ZeRO over the survivors.
      z.group = ng;
      table_ = new_table;
      z.remake_local_optimizer();
      for (const auto& p : z.part.shard(z.rank)) {
        auto it = avail.find(p.key());
        if (it != avail.end()) z.optim->state()[p.key()] = it->second;
      }
      commit(z, avail);
      z.trainable = z.params.trainable_mask();
      trace.mark("new optimizers", old_rank);
      commit_buckets(z, loss, same_trainable, kinds, moved, keep_anew);
      trace.mark("buckets", old_rank);
      if (in_step) ++z.steps;
      z.sync_to_local();
      z.dicts.clear();
      rec.step = z.steps;
      rec.step_completed = in_step;
      return rec;
    } catch (const PeerLostError&) {
      z.world = old_world;
      z.rank = old_rank;
      z.part = old_partition;
      table_ = old_table;
      abandon_try();
    }
  }
}

}  // namespace dopt::optim::zero_detail
