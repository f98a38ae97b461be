// ZeroRedundancyOptimizer's redundancy: the buddies' copies of the shards,
// and the recovery from a lost rank (contract in zero.hpp, design in
// docs/fault-tolerance.md).
#include <algorithm>
#include <cstring>
#include <sstream>
#include <unordered_map>

#include "agreement.hpp"
#include "dopt/optim/zero.hpp"

namespace dopt::optim {
namespace {

constexpr const char* kRecover = "ZeroRedundancyOptimizer.recover";

int capped(int requested, int world) { return std::max(0, std::min(requested, world - 1)); }

/// Group ranks r+1 .. r+k, cyclically.
std::vector<int> buddies_in(int r, int k, int world) {
  std::vector<int> out;
  for (int j = 1; j <= k; ++j) out.push_back((r + j) % world);
  return out;
}

std::string list_str(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

/// One state tensor of a shard, as its holder describes it to the others.
struct Entry {
  std::int64_t index = 0;  // global parameter index
  std::string key;
  DType dtype = DType::float32;
  Shape shape;
};

std::string describe(const std::vector<Entry>& es) {
  std::ostringstream os;
  for (const auto& e : es) {
    os << e.index << ' ' << e.key << ' ' << static_cast<int>(e.dtype) << ' ' << e.shape.size();
    for (auto d : e.shape) os << ' ' << d;
    os << '\n';
  }
  return os.str();
}

std::vector<Entry> parse(const std::string& text) {
  std::vector<Entry> out;
  std::istringstream is(text);
  Entry e;
  int dt = 0;
  std::size_t nd = 0;
  while (is >> e.index >> e.key >> dt >> nd) {
    e.dtype = static_cast<DType>(dt);
    e.shape.assign(nd, 0);
    for (auto& d : e.shape) is >> d;
    out.push_back(e);
  }
  return out;
}

/// A string to group rank dst (its length, then its bytes), and back.
void send_string(ProcessGroup& g, const std::string& s, int dst, int tag) {
  g.send(Tensor::full({1}, static_cast<double>(s.size()), DType::int64), dst, tag);
  if (s.empty()) return;
  Tensor bytes = Tensor::empty({static_cast<std::int64_t>(s.size())}, DType::uint8);
  std::memcpy(bytes.data_ptr(), s.data(), s.size());
  g.send(bytes, dst, tag);
}

std::string recv_string(ProcessGroup& g, int src, int tag) {
  Tensor len = Tensor::zeros({1}, DType::int64);
  g.recv(len, src, tag);
  const std::int64_t n = len.data<std::int64_t>()[0];
  if (n <= 0) return "";
  Tensor bytes = Tensor::empty({n}, DType::uint8);
  g.recv(bytes, src, tag);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(n));
}

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
  return buddies_in(r, redundancy(), world_size_);
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
  return b;
}

void ZeroRedundancyOptimizer::make_buddy_copies() {
  buddy_copies_.clear();
  const int k = redundancy();
  for (int j = 1; j <= k; ++j) {
    const int target = ((rank_ - j) % world_size_ + world_size_) % world_size_;
    std::vector<OptimizerParamGroup> gs;
    for (std::size_t g = 0; g < groups_.size(); ++g)
      gs.emplace_back(partition_[static_cast<std::size_t>(target)][g], groups_[g].options->clone());
    buddy_copies_[target] = make_optimizer(spec_, std::move(gs));
  }
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
  std::vector<std::vector<std::int64_t>> shard(static_cast<std::size_t>(old_world));  // global indices, old order
  for (int o = 0; o < old_world; ++o)
    for (const auto& g : old_partition[static_cast<std::size_t>(o)])
      for (const auto& p : g) shard[static_cast<std::size_t>(o)].push_back(index_of_.at(p.key()));

  // A further loss while recovering: start again from the old group (the
  // survivors' group then leaves that rank out too). Nothing of this rank's
  // state changes before the end.
  for (;;) {
    try {
      ShrinkResult sr = group_.shrink();
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
        const auto bs = buddies_in(o, old_k, old_world);
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

      // 3. The step in flight: each shard's parameters from its holder (the
      //    owner, or the buddy that stepped its copy in the same step).
      if (in_step)
        for (int o = 0; o < old_world; ++o) {
          std::vector<Tensor> ps;
          for (const auto& g : old_partition[static_cast<std::size_t>(o)])
            for (const auto& p : g) ps.push_back(p);
          broadcast_all(ng, ps, source[static_cast<std::size_t>(o)]);
        }

      // 4. The partition over the survivors, as a new optimizer over them
      //    would make it; every state tensor goes to its new owner and buddies.
      world_size_ = nw;
      rank_ = me;
      partition_parameters();
      const int new_k = redundancy();
      auto held_by = [&](std::size_t i, int r) {
        const int o = owner_[i];
        if (o == r) return true;
        const auto bs = buddies_in(o, new_k, nw);
        return std::find(bs.begin(), bs.end(), r) != bs.end();
      };
      auto kept_before = [&](int o, int r) {  // new group rank r kept old rank o's shard
        if (sr.new_rank[static_cast<std::size_t>(o)] == r) return true;
        for (int b : buddies_in(o, old_k, old_world))
          if (sr.new_rank[static_cast<std::size_t>(b)] == r) return true;
        return false;
      };
      std::unordered_map<const TensorImpl*, ParamState> avail;
      for (const auto& [k, st] : optim_->state()) avail[k] = st;
      for (const auto& [t, copy] : buddy_copies_)
        for (const auto& [k, st] : copy->state()) avail[k] = st;
      for (int o = 0; o < old_world; ++o) {
        const auto uo = static_cast<std::size_t>(o);
        const int s = source[uo];
        // Point to point: the holder sends each rank only the state of the
        // parameters it keeps from now on (as new owner or buddy). Every rank
        // takes the shards in the same order, so the sends cannot wait on
        // each other in a cycle.
        // A survivor that kept this shard before (its owner or a buddy: the
        // same bytes as the holder's) needs nothing.
        std::vector<int> receivers;
        for (int r = 0; r < nw; ++r) {
          bool any = false;
          for (auto i : shard[uo]) any = any || held_by(static_cast<std::size_t>(i), r);
          if (r != s && any && !kept_before(o, r)) receivers.push_back(r);
        }
        const int tag = o;
        std::vector<Future<void>> works;
        std::exception_ptr first;
        if (me == s) {
          for (int r : receivers) {
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
            send_string(ng, describe(entries), r, tag);
            for (const auto& t : tensors) works.push_back(ng.send_async(t, r, tag));
          }
        } else if (std::find(receivers.begin(), receivers.end(), me) != receivers.end()) {
          const auto entries = parse(recv_string(ng, s, tag));
          std::vector<Tensor> tensors;
          for (const auto& e : entries) {
            tensors.push_back(Tensor::empty(e.shape, e.dtype, all_params_[static_cast<std::size_t>(e.index)].device()));
            works.push_back(ng.recv_async(tensors.back(), s, tag));
          }
          for (auto& w : works) wait_keeping_first_error(w, first);
          works.clear();
          if (first) std::rethrow_exception(first);
          for (std::size_t j = 0; j < entries.size(); ++j)
            avail[all_params_[static_cast<std::size_t>(entries[j].index)].key()][entries[j].key] = tensors[j];
        }
        for (auto& w : works) wait_keeping_first_error(w, first);
        if (first) std::rethrow_exception(first);
      }

      // 5. Commit: ZeRO over the survivors.
      group_ = ng;
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
      if (bucket_view_) build_buckets();
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
    }
  }
}

}  // namespace dopt::optim
