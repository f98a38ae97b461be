// ZeroRedundancyOptimizer's redundancy: the buddies and their copies of the
// shards (ZeroBuddyUpdate::step), and the recovery from a lost rank
// (contract in zero.hpp, design in docs/fault-tolerance.md). The replay
// buddies' saved steps and snapshots: zero_replay.cpp.
#include <sys/resource.h>
#include "dopt/runtime/settings.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "survive/agreement.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/actors/host.hpp"
#include "dopt/distributed/zero.hpp"
#include "survive/survive_util.hpp"
#include "zero_host_memory.hpp"
#include "zero_internal.hpp"
#include "zero_wire.hpp"

namespace dopt::optim {
namespace {

using zero_detail::describe;
using zero_detail::Entry;
using zero_detail::kName;
using zero_detail::parse;
using zero_detail::post_string;
using zero_detail::recv_string;
constexpr const char* kRecover = "ZeroRedundancyOptimizer.recover";

int capped(int requested, int world) { return std::max(0, std::min(requested, world - 1)); }

/// The buddies of every rank of a group whose rank r is on host[r]; k is
/// already capped at size - 1. One host: r+1, ..., r+k cyclically. Several:
/// the ranks are listed host by host in turn (the first rank of every host
/// in order of their first rank, then the second of each, ...), and in that
/// order each rank takes k buddies: ranks on other hosts first, then the
/// ones that keep the fewest shards so far, then the nearest after it in the
/// list. Every rank computes the same table.
std::vector<std::vector<int>> choose_buddies(const std::vector<std::string>& host, int k) {
  const int n = static_cast<int>(host.size());
  std::vector<std::vector<int>> out(static_cast<std::size_t>(n));
  std::vector<std::string> hosts;  // in order of their first rank
  std::vector<std::vector<int>> on;  // ranks of each host, ascending
  for (int r = 0; r < n; ++r) {
    auto it = std::find(hosts.begin(), hosts.end(), host[static_cast<std::size_t>(r)]);
    if (it == hosts.end()) {
      hosts.push_back(host[static_cast<std::size_t>(r)]);
      on.emplace_back();
      it = hosts.end() - 1;
    }
    on[static_cast<std::size_t>(it - hosts.begin())].push_back(r);
  }
  if (hosts.size() <= 1) {
    for (int r = 0; r < n; ++r)
      for (int j = 1; j <= k; ++j) out[static_cast<std::size_t>(r)].push_back((r + j) % n);
    return out;
  }
  std::vector<int> order, pos(static_cast<std::size_t>(n), 0), load(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 0; order.size() < static_cast<std::size_t>(n); ++i)
    for (const auto& rs : on)
      if (i < rs.size()) order.push_back(rs[i]);
  for (int j = 0; j < n; ++j) pos[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] = j;
  for (int r : order) {
    const auto ur = static_cast<std::size_t>(r);
    std::vector<int> cand;
    for (int c = 0; c < n; ++c)
      if (c != r) cand.push_back(c);
    auto key = [&](int c) {
      const auto uc = static_cast<std::size_t>(c);
      return std::make_tuple(host[uc] == host[ur] ? 1 : 0, load[uc], (pos[uc] - pos[ur] + n) % n);
    };
    std::sort(cand.begin(), cand.end(), [&](int a, int b) { return key(a) < key(b); });
    for (int j = 0; j < k; ++j) {
      out[ur].push_back(cand[static_cast<std::size_t>(j)]);
      ++load[static_cast<std::size_t>(cand[static_cast<std::size_t>(j)])];
    }
  }
  return out;
}

/// ZeroBuddyUpdate::host_memory: each rank's buddies are the other ranks of
/// its own host (they all map its segments), from the next one on, cyclically.
std::vector<std::vector<int>> choose_buddies_on_host(const std::vector<std::string>& host) {
  const int n = static_cast<int>(host.size());
  std::vector<std::vector<int>> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    std::vector<int> same;
    for (int c = 0; c < n; ++c)
      if (host[static_cast<std::size_t>(c)] == host[static_cast<std::size_t>(r)]) same.push_back(c);
    const auto pos = static_cast<int>(std::find(same.begin(), same.end(), r) - same.begin());
    const int m = static_cast<int>(same.size());
    for (int j = 1; j < m; ++j)
      out[static_cast<std::size_t>(r)].push_back(same[static_cast<std::size_t>((pos + j) % m)]);
  }
  return out;
}

/// 64-bit FNV-1a of a string, as a non-negative int64.
std::int64_t host_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(h >> 1);
}

std::string list_str(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

/// The partition over the survivors (new_rank[o]: old rank o's new rank, -1
/// lost): each survivor keeps the parameters it owned, in the same order;
/// the lost ranks' parameters go, group by group and heaviest first, to the
/// survivor with the least weight so far (the lowest rank on a tie). Every
/// survivor computes the same; the state of what a survivor kept stays put.
void partition_keeping(const std::vector<std::vector<std::vector<Tensor>>>& old_partition,
                       const std::vector<int>& new_rank, int nw, const std::vector<double>& weight,
                       const std::unordered_map<const TensorImpl*, std::int64_t>& index_of,
                       std::vector<std::vector<std::vector<Tensor>>>& partition, std::vector<int>& owner) {
  const std::size_t ng = old_partition.empty() ? 0 : old_partition.front().size();
  partition.assign(static_cast<std::size_t>(nw), std::vector<std::vector<Tensor>>(ng));
  owner.assign(weight.size(), -1);
  std::vector<double> sizes(static_cast<std::size_t>(nw), 0.0);
  auto w = [&](const Tensor& p) { return weight[static_cast<std::size_t>(index_of.at(p.key()))]; };
  auto give = [&](const Tensor& p, std::size_t g, int r) {
    partition[static_cast<std::size_t>(r)][g].push_back(p);
    sizes[static_cast<std::size_t>(r)] += w(p);
    owner[static_cast<std::size_t>(index_of.at(p.key()))] = r;
  };
  for (std::size_t o = 0; o < old_partition.size(); ++o)
    if (new_rank[o] >= 0)
      for (std::size_t g = 0; g < ng; ++g)
        for (const auto& p : old_partition[o][g]) give(p, g, new_rank[o]);
  for (std::size_t g = 0; g < ng; ++g) {
    std::vector<Tensor> lost;
    for (std::size_t o = 0; o < old_partition.size(); ++o)
      if (new_rank[o] < 0) lost.insert(lost.end(), old_partition[o][g].begin(), old_partition[o][g].end());
    std::stable_sort(lost.begin(), lost.end(), [&](const Tensor& a, const Tensor& b) { return w(a) > w(b); });
    for (const auto& p : lost) {
      int r = 0;
      for (int k = 1; k < nw; ++k)
        if (sizes[static_cast<std::size_t>(k)] < sizes[static_cast<std::size_t>(r)]) r = k;
      give(p, g, r);
    }
  }
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

int ZeroRedundancyOptimizer::redundancy() const noexcept { return capped(redundancy_, world_size_); }

std::vector<int> ZeroRedundancyOptimizer::buddies(int r) const {
  if (r < 0 || r >= world_size_)
    throw ValueError("ZeroRedundancyOptimizer.buddies", "rank " + std::to_string(r) + " is not in the group", rank_);
  if (buddy_table_.empty()) return {};
  return buddy_table_[static_cast<std::size_t>(r)];
}

void ZeroRedundancyOptimizer::init_hosts(const std::vector<std::string>& given) {
  const auto& members = group_.ranks();
  host_of_.clear();
  if (!given.empty()) {
    if (static_cast<int>(given.size()) != world_size_)
      throw ValueError(kName, "ZeroOptions::hosts names " + std::to_string(given.size()) +
                                  " host(s), but the group has " + std::to_string(world_size_) + " ranks", rank_);
    for (int r = 0; r < world_size_; ++r) host_of_[members[static_cast<std::size_t>(r)]] = given[static_cast<std::size_t>(r)];
  } else {
    // Measured: every rank's host id, as a hash (equal ids, equal hashes).
    const auto all = detail::all_gather_descriptors(group_, {host_hash(this_host_id())});
    for (int r = 0; r < world_size_; ++r)
      host_of_[members[static_cast<std::size_t>(r)]] = std::to_string(all[static_cast<std::size_t>(r)][0]);
  }
  buddy_table_ = buddy_table_for(members);
  if (buddy_update_ == ZeroBuddyUpdate::host_memory && redundancy() > 0)
    for (int r = 0; r < world_size_; ++r)
      if (buddy_table_[static_cast<std::size_t>(r)].empty())
        throw ValueError(kName, "ZeroBuddyUpdate::host_memory keeps each rank's shard in shared memory on its host, "
                                "but rank " + std::to_string(members[static_cast<std::size_t>(r)]) +
                                    " is alone on its host; use ZeroBuddyUpdate::step (buddies on other hosts)",
                         rank_);
}

std::vector<std::vector<int>> ZeroRedundancyOptimizer::buddy_table_for(const std::vector<int>& members) const {
  std::vector<std::string> host;
  for (int g : members) {
    auto it = host_of_.find(g);
    host.push_back(it == host_of_.end() ? std::string() : it->second);
  }
  const int k = capped(redundancy_, static_cast<int>(members.size()));
  // Host memory: every other rank of the host maps the segments (k only turns it on).
  if (buddy_update_ == ZeroBuddyUpdate::host_memory)
    return k > 0 ? choose_buddies_on_host(host) : std::vector<std::vector<int>>(host.size());
  return choose_buddies(host, k);
}

bool ZeroRedundancyOptimizer::keeps_state_of(std::size_t i) const {
  const int o = owner_[i];
  return o == rank_ || buddy_copies_.count(o) > 0;
}

std::int64_t ZeroRedundancyOptimizer::buddy_state_bytes() const {
  std::int64_t b = 0;
  for (const auto& [r, copy] : buddy_copies_)
    for (const auto& [k, st] : copy->state())
      for (const auto& [name, t] : st)
        if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  auto add = [&](const std::vector<Tensor>& ts) {
    for (const auto& t : ts)
      if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  };
  for (const auto& [r, log] : buddy_logs_) {
    add(log.params);
    add(log.incoming);
    for (const auto& sv : log.saved) add(sv.grads);
    for (const auto& sp : log.spare) add(sp);
  }
  return b;
}

void ZeroRedundancyOptimizer::make_buddy_copies() {
  buddy_copies_.clear();
  if (host_memory()) return;  // the buddies map the owner's segment instead (zero_host_memory.cpp)
  for (int target = 0; target < world_size_; ++target) {
    const auto& bs = buddy_table_[static_cast<std::size_t>(target)];
    if (std::find(bs.begin(), bs.end(), rank_) == bs.end()) continue;
    std::vector<OptimizerParamGroup> gs;
    for (std::size_t g = 0; g < groups_.size(); ++g)
      gs.emplace_back(partition_[static_cast<std::size_t>(target)][g], groups_[g].options->clone());
    buddy_copies_[target] = make_optimizer(spec_, std::move(gs));
  }
  buddy_logs_.clear();
  if (replays())
    for (const auto& [target, copy] : buddy_copies_) buddy_logs_[target];
  reset_buddy_snapshots();
}

// --- ZeroBuddyUpdate::replay -------------------------------------------------------

std::vector<Tensor> ZeroRedundancyOptimizer::shard_params(int r) const {
  std::vector<Tensor> out;
  for (const auto& g : partition_[static_cast<std::size_t>(r)])
    for (const auto& p : g) out.push_back(p);
  return out;
}

void ZeroRedundancyOptimizer::step_buddy_copies() {
  // The owner steps with ZeRO's hyperparameters (sync_to_local) and the
  // averaged gradients every rank holds: so does each copy, bitwise alike.
  for (auto& [target, copy] : buddy_copies_) {
    auto& gs = copy->param_groups();
    for (std::size_t g = 0; g < groups_.size() && g < gs.size(); ++g) gs[g].options = groups_[g].options->clone();
    copy->step();
  }
}

ZeroRecovery ZeroRedundancyOptimizer::recover() {
  if (redundancy_ == 0)
    throw StateError(kRecover, "recovery needs ZeroOptions::redundancy > 0 (no rank keeps a copy of another's state)",
                     rank_);
  return recover_from_loss(false);
}

ZeroRecovery ZeroRedundancyOptimizer::recover_from_loss(bool in_step) {
  const std::string op = in_step ? std::string("ZeroRedundancyOptimizer.step") : std::string(kRecover);
  const int old_world = world_size_;
  const int old_rank = rank_;
  const int old_k = redundancy();
  const std::vector<int> old_members = group_.ranks();
  const auto old_partition = partition_;
  const auto old_owner = owner_;
  const auto old_table = buddy_table_;
  std::vector<std::vector<std::int64_t>> shard(static_cast<std::size_t>(old_world));  // global indices, old order
  for (int o = 0; o < old_world; ++o)
    for (const auto& g : old_partition[static_cast<std::size_t>(o)])
      for (const auto& p : g) shard[static_cast<std::size_t>(o)].push_back(index_of_.at(p.key()));

  // A further loss while recovering: start again from the old group (the
  // survivors' group then leaves that rank out too). Nothing of this rank's
  // state changes before the end, except that a replayed copy is brought up
  // to date (the same bits whenever it is done; a retry finds nothing saved).
  std::map<int, std::unordered_map<const TensorImpl*, ParamState>> rebuilt_by_owner;  // host memory
  for (;;) {
    try {
      PhaseTrace trace;
      ShrinkResult sr = group_.shrink();
      trace.mark("shrink", old_rank);
      ProcessGroup ng = sr.group;
      const int nw = ng.size(), me = ng.rank();
      ZeroRecovery rec;
      rec.group = ng;
      rec.lost = sr.lost;
      rec.new_rank = sr.new_rank;
      rec.step = steps_;

      // 1. Every survivor stopped at the same step, in the same place.
      const auto where = detail::all_gather_descriptors(ng, {steps_, in_step ? 1 : 0});
      for (int r = 1; r < nw; ++r)
        if (where[static_cast<std::size_t>(r)] != where[0]) {
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
      std::vector<int> source(static_cast<std::size_t>(old_world), -1);  // new group rank
      std::string gone;
      for (int o = 0; o < old_world; ++o) {
        const auto uo = static_cast<std::size_t>(o);
        if (sr.new_rank[uo] >= 0) {
          source[uo] = sr.new_rank[uo];
          continue;
        }
        const auto& bs = old_table[uo];
        for (int b : bs)
          if (sr.new_rank[static_cast<std::size_t>(b)] >= 0) {
            source[uo] = sr.new_rank[static_cast<std::size_t>(b)];
            break;
          }
        if (source[uo] >= 0 || shard[uo].empty()) continue;
        std::int64_t elems = 0;
        std::vector<int> idx;
        for (auto i : shard[uo]) {
          elems += all_params_[static_cast<std::size_t>(i)].numel();
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

      // Replay: the buddy that holds a lost owner's shard now first brings
      // its copy (state and the shard's parameters) up to date.
      const bool replay = replays();
      if (replay)
        for (int o = 0; o < old_world; ++o)
          if (sr.new_rank[static_cast<std::size_t>(o)] < 0 && source[static_cast<std::size_t>(o)] == me)
            replay_buddy(o);

      // Host memory: the buddy that holds a lost owner's shard now rebuilds
      // it from the owner's segment (its parameters end at the step in flight).
      // Once per owner: a retry after a further loss finds this rank's
      // parameters of the shard already at the step in flight.
      std::unordered_map<const TensorImpl*, ParamState> rebuilt;
      if (host_memory())
        for (int o = 0; o < old_world; ++o)
          if (sr.new_rank[static_cast<std::size_t>(o)] < 0 && buddy_keeps_.count(o)) {  // every rank that maps it
            if (!rebuilt_by_owner.count(o)) rebuilt_by_owner[o] = rebuild_from_keep(o, in_step);
            for (const auto& [key, st] : rebuilt_by_owner[o]) rebuilt[key] = st;
          }

      trace.mark("agreement and replay", old_rank);
      // 3. The step in flight: each shard's parameters from its holder (the
      //    owner, or the buddy that stepped its copy in the same step).
      //    With host memory a lost owner whose every survivor mapped its
      //    segment needs none: each of them rebuilt the same values.
      auto mapped_by_all = [&](int o) {
        if (!host_memory() || sr.new_rank[static_cast<std::size_t>(o)] >= 0) return false;
        const auto& bs = old_table[static_cast<std::size_t>(o)];
        for (int r = 0; r < old_world; ++r)
          if (r != o && sr.new_rank[static_cast<std::size_t>(r)] >= 0 && std::find(bs.begin(), bs.end(), r) == bs.end())
            return false;
        return true;
      };
      if (in_step)
        for (int o = 0; o < old_world; ++o) {
          if (mapped_by_all(o)) continue;
          std::vector<Tensor> ps;
          for (const auto& g : old_partition[static_cast<std::size_t>(o)])
            for (const auto& p : g) ps.push_back(p);
          broadcast_all(ng, ps, source[static_cast<std::size_t>(o)]);
        }

      trace.mark("step in flight broadcast", old_rank);
      // 4. The partition over the survivors: each keeps what it owned, the
      //    lost ranks' parameters are shared out; every state tensor goes to
      //    its new owner and buddies (where it is not already).
      world_size_ = nw;
      rank_ = me;
      partition_keeping(old_partition, sr.new_rank, nw, partition_weights(), index_of_, partition_, owner_);
      const auto new_table = buddy_table_for(ng.ranks());
      // The parameters each survivor takes over from lost ranks, by kind
      // (device, dtype) in order of first appearance: one more row of buckets.
      std::vector<std::pair<Device, DType>> kinds;
      std::vector<std::vector<std::vector<Tensor>>> moved(static_cast<std::size_t>(nw));  // [rank][kind]
      for (int r = 0; r < nw; ++r)
        for (const auto& g : partition_[static_cast<std::size_t>(r)])
          for (const auto& p : g) {
            const int was = old_owner[static_cast<std::size_t>(index_of_.at(p.key()))];
            if (sr.new_rank[static_cast<std::size_t>(was)] >= 0 || !p.requires_grad()) continue;
            std::size_t k = 0;
            while (k < kinds.size() && !(kinds[k].first == p.device() && kinds[k].second == p.dtype())) ++k;
            if (k == kinds.size()) kinds.emplace_back(p.device(), p.dtype());
            auto& mr = moved[static_cast<std::size_t>(r)];
            if (mr.size() <= k) mr.resize(k + 1);
            mr[k].push_back(p);
          }
      const bool same_trainable = trainable_mask() == trainable_;
      // Host memory: each survivor's new segment, mapped by its new buddies
      // (a loss here retries from the old group like any other). It holds
      // what the survivor takes over (its row of the new buckets, and the
      // state of frozen parameters it takes over); what it kept stays in its
      // older segments. With other trainable parameters: one segment anew.
      const bool keep_anew = !same_trainable;
      zero_detail::KeepShare share;
      if (host_memory()) {
        std::map<int, zero_detail::KeepSpec> fresh;
        for (int r = 0; r < nw; ++r) {
          zero_detail::KeepSpec sp;
          if (keep_anew) {
            sp = full_keep_spec(r);
          } else {
            for (const auto& kd : kinds) sp.bucket_dtypes.push_back(kd.second);
            const auto& mr = moved[static_cast<std::size_t>(r)];
            for (std::size_t k = 0; k < mr.size(); ++k)
              for (const auto& p : mr[k]) {
                sp.params.push_back(index_of_.at(p.key()));
                sp.kind.push_back(static_cast<int>(k));
              }
            for (const auto& g : partition_[static_cast<std::size_t>(r)])
              for (const auto& p : g) {
                const int was = old_owner[static_cast<std::size_t>(index_of_.at(p.key()))];
                if (sr.new_rank[static_cast<std::size_t>(was)] < 0 && !p.requires_grad()) {
                  sp.params.push_back(index_of_.at(p.key()));
                  sp.kind.push_back(-1);
                }
              }
          }
          fresh[ng.global_rank(r)] = std::move(sp);
        }
        share = share_keeps(ng, new_table, fresh, keep_anew);
        trace.mark("new segments", old_rank);
      }

      auto held_by = [&](std::size_t i, int r) {
        const int o = owner_[i];
        if (o == r) return true;
        if (host_memory()) return false;  // buddies map the owner's segment, they keep no copy
        const auto& bs = new_table[static_cast<std::size_t>(o)];
        return std::find(bs.begin(), bs.end(), r) != bs.end();
      };
      auto kept_before = [&](int o, int r) {  // new group rank r kept old rank o's shard, up to date
        if (sr.new_rank[static_cast<std::size_t>(o)] == r) return true;
        if (replay) return source[static_cast<std::size_t>(o)] == r;  // other copies are from a snapshot
        for (int b : old_table[static_cast<std::size_t>(o)])
          if (sr.new_rank[static_cast<std::size_t>(b)] == r) return true;
        return false;
      };
      std::unordered_map<const TensorImpl*, ParamState> avail;
      for (const auto& [k, st] : optim_->state()) avail[k] = st;
      for (const auto& [t, copy] : buddy_copies_) {
        if (replay && !(sr.new_rank[static_cast<std::size_t>(t)] < 0 && source[static_cast<std::size_t>(t)] == me))
          continue;  // a snapshot's state, not the owner's now
        for (const auto& [k, st] : copy->state()) avail[k] = st;
      }
      for (auto& [k, st] : rebuilt) avail[k] = std::move(st);
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
          if (r != source[uo] && any && !kept_before(o, r)) receivers[uo].push_back(r);
        }
      }
      std::vector<Future<void>> sends, recvs;
      for (int o = 0; o < old_world; ++o) {
        const auto uo = static_cast<std::size_t>(o);
        if (source[uo] != me) continue;
        for (int r : receivers[uo]) {
          std::vector<Entry> entries;
          std::vector<Tensor> tensors;
          for (auto i : shard[uo]) {
            if (!held_by(static_cast<std::size_t>(i), r)) continue;
            auto it = avail.find(all_params_[static_cast<std::size_t>(i)].key());
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
          const int s = source[uo];
          if (std::find(receivers[uo].begin(), receivers[uo].end(), me) == receivers[uo].end()) continue;
          for (const auto& e : parse(recv_string(ng, s, /*tag=*/o))) {
            got.push_back(e);
            // Host memory: straight into this rank's new segment where it has room for it.
            Tensor in = share.own ? share.own->entry_for(e.index, e.key, e.shape, e.dtype) : Tensor();
            into.push_back(in.defined() ? in
                                        : Tensor::empty(e.shape, e.dtype, all_params_[static_cast<std::size_t>(e.index)].device()));
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
        avail[all_params_[static_cast<std::size_t>(got[j].index)].key()][got[j].key] = into[j];

      trace.mark("state moved", old_rank);
      // 5. Commit: ZeRO over the survivors.
      group_ = ng;
      buddy_table_ = new_table;
      optim_ = make_optimizer(spec_, local_groups(0));
      make_buddy_copies();
      auto take = [&](Optimizer& opt, int r) {
        for (const auto& g : partition_[static_cast<std::size_t>(r)])
          for (const auto& p : g) {
            auto it = avail.find(p.key());
            if (it != avail.end()) opt.state()[p.key()] = it->second;
          }
      };
      take(*optim_, rank_);
      for (auto& [t, copy] : buddy_copies_) take(*copy, t);
      trainable_ = trainable_mask();
      trace.mark("new optimizers", old_rank);
      if (bucket_view_ && same_trainable) {
        // The survivors' buckets stay (renumbered): what each kept is still
        // in its bucket, in order. The parameters that came from lost ranks
        // go into one more row of buckets (one per kind, one flat buffer per
        // rank, in partition order), so only they are copied (this rank's
        // into its new segment with host memory).
        std::vector<std::vector<Tensor>> rows;
        for (const auto& row : buckets_) {
          std::vector<Tensor> kept(static_cast<std::size_t>(nw));
          for (int o = 0; o < old_world; ++o)
            if (sr.new_rank[static_cast<std::size_t>(o)] >= 0)
              kept[static_cast<std::size_t>(sr.new_rank[static_cast<std::size_t>(o)])] = row[static_cast<std::size_t>(o)];
          rows.push_back(std::move(kept));
        }
        for (std::size_t k = 0; k < kinds.size(); ++k) {
          std::vector<Tensor> row(static_cast<std::size_t>(nw));
          for (int r = 0; r < nw; ++r) {
            auto& mr = moved[static_cast<std::size_t>(r)];
            std::int64_t total = 0;
            if (k < mr.size())
              for (const auto& p : mr[k]) total += p.numel();
            if (total == 0) {
              row[static_cast<std::size_t>(r)] = Tensor::zeros({1}, kinds[k].second, kinds[k].first);
              continue;
            }
            Tensor bucket = (share.own && r == rank_) ? share.own->bucket(k)
                                                      : Tensor::empty({total}, kinds[k].second, kinds[k].first);
            std::int64_t off = 0;
            for (const auto& p : mr[k]) {
              Tensor slice = bucket.flat_slice(off, p.numel());
              slice.copy_(p);
              repoint(p, slice.view(p.shape()));
              off += p.numel();
            }
            row[static_cast<std::size_t>(r)] = std::move(bucket);
          }
          rows.push_back(std::move(row));
        }
        buckets_ = std::move(rows);
      } else if (bucket_view_ && !host_memory()) {
        build_buckets();  // (host memory: install_keeps below builds them, this rank's in its segment)
      }
      if (host_memory()) {
        // The lost ranks' segments are rebuilt from: their names go (the
        // mappings stay while anything uses them).
        for (const auto& [o, ks] : buddy_keeps_)  // by its host-mates (the names are the host's)
          if (sr.new_rank[static_cast<std::size_t>(o)] < 0)
            for (const auto& k : ks) k->remove_name();
        install_keeps(std::move(share), keep_anew);
      }
      trace.mark("buckets", old_rank);
      if (in_step) ++steps_;
      sync_to_local();
      all_state_dicts_.clear();
      rec.step = steps_;
      rec.step_completed = in_step;
      return rec;
    } catch (const PeerLostError&) {
      world_size_ = old_world;
      rank_ = old_rank;
      partition_ = old_partition;
      owner_ = old_owner;
      buddy_table_ = old_table;
    }
  }
}

}  // namespace dopt::optim
