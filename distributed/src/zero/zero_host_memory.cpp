// HostMemoryBuddies (zero_buddies.hpp; ZeroBuddyUpdate::host_memory): the
// checks, the segments' plans, making and exchanging them, the journaling
// hook, the reads of the parameters from the segments, and the rebuild of a
// lost owner's shard (the segment itself: zero_host_keep.cpp; the design in
// docs/fault-tolerance-optimizers.md, "Host memory").
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "survive/agreement.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/internal/shm.hpp"
#include "zero_buddies.hpp"
#include "zero_core.hpp"
#include "zero_host_memory.hpp"
#include "zero_internal.hpp"

namespace dopt::optim::zero_detail {
namespace {

/// Each rank's buddies are the other ranks of its own host (they all map its
/// segments), from the next one on, cyclically.
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

}  // namespace

void HostMemoryBuddies::check(const ZeroCore& z, const ZeroOptions&) const {
  const std::int64_t chunk = chunk_;
  const char* why = "ZeroBuddyUpdate::host_memory keeps each rank's shard in shared memory on its host";
  if (chunk < 1 || chunk > (std::int64_t{1} << 26))
    throw ValueError(kName, "host_memory_chunk must be in [1, 2^26], got " + std::to_string(chunk), z.rank);
  if (!z.bucket_view)
    throw ValueError(kName, std::string(why) + ": it needs parameters_as_bucket_view=true (this rank's "
                                         "bucket is in that memory)", z.rank);
  if (!elementwise_optimizer(z.spec.name))
    throw NotSupportedError(kName, std::string(why) + " and updates parameters in pieces, which " +
                                                    z.spec.name + " does not allow (its update of an element depends "
                                                    "on others); use ZeroBuddyUpdate::step", z.rank);
  for (const auto& p : z.params.all())
    if (!p.device().is_cpu())
      throw NotSupportedError(kName, std::string(why) + ": parameters on " + p.device().str() +
                                                      " are not supported (CPU only); use ZeroBuddyUpdate::step",
                              z.rank);
}

KeepSpec HostMemoryBuddies::full_spec(const ZeroCore& z, int r) const {
  // The kinds of the buckets, as Buckets::build orders them.
  std::vector<Kind> kinds = Buckets::kinds(z.part);
  KeepSpec spec;
  for (const auto& k : kinds) spec.bucket_dtypes.push_back(k.second);
  for (const auto& p : z.part.shard(r)) {
    spec.params.push_back(z.params.index_of(p));
    spec.kind.push_back(p.requires_grad() ? static_cast<int>(Buckets::kind_index(kinds, p)) : -1);
  }
  return spec;
}

KeepPlan HostMemoryBuddies::plan_of(const ZeroCore& z, const KeepSpec& spec) {
  KeepPlan plan;
  plan.chunk = chunk_;
  const std::vector<std::size_t> group_of = z.params.group_of_each();
  std::map<std::pair<std::size_t, int>, std::size_t> layout_index;
  plan.bucket_elems.assign(spec.bucket_dtypes.size(), 0);
  for (std::size_t j = 0; j < spec.params.size(); ++j) {
    const Tensor& p = z.params.at(static_cast<std::size_t>(spec.params[j]));
    const std::size_t g = group_of[static_cast<std::size_t>(spec.params[j])];
    const std::pair<std::size_t, int> key{g, static_cast<int>(p.dtype())};
    auto lit = layouts_.find(key);
    if (lit == layouts_.end()) {
      // One step of the optimizer on a probe of two elements: its state entries.
      Tensor x = Tensor::zeros({2}, p.dtype());
      x.set_grad(Tensor::full({2}, 0.5, p.dtype()));
      std::vector<OptimizerParamGroup> gs;
      gs.emplace_back(std::vector<Tensor>{x}, z.params.groups()[g].options->clone());
      auto opt = make_optimizer(z.spec, std::move(gs));
      opt->step();
      std::vector<KeepEntry> entries;
      for (const auto& [name, t] : opt->state()[x.key()]) {
        if (!t.defined()) continue;
        KeepEntry e;
        e.name = name;
        e.dtype = t.dtype();
        e.full = t.numel() == 2;
        if (!e.full) {
          e.scalar_shape = t.shape();
          if (t.nbytes() > 8)
            throw NotSupportedError(kName, "host_memory redundancy: state entry '" + name + "' of " +
                                                            z.spec.name + " is neither per element nor a scalar",
                                    z.rank);
        }
        entries.push_back(std::move(e));
      }
      lit = layouts_.emplace(key, std::move(entries)).first;
    }
    auto [it, fresh] = layout_index.emplace(key, plan.layouts.size());
    if (fresh) plan.layouts.push_back(lit->second);
    KeepParam kp;
    kp.global = spec.params[j];
    kp.numel = p.numel();
    kp.shape = p.shape();
    kp.dtype = p.dtype();
    kp.layout = it->second;
    kp.group = g;
    if (spec.kind[j] >= 0) plan.bucket_elems[static_cast<std::size_t>(spec.kind[j])] += p.numel();
    plan.params.push_back(std::move(kp));
  }
  plan.lay_out(spec.bucket_dtypes, spec.kind);
  return plan;
}

KeepShare HostMemoryBuddies::share(const ZeroCore& z, ProcessGroup& g, const std::vector<std::vector<int>>& table,
                                   const std::map<int, KeepSpec>& fresh, bool anew) {
  const int me = g.rank(), n = g.size();
  KeepShare out;
  out.own = HostKeep::create(plan_of(z, fresh.at(g.global_rank(me))));
  const auto names = detail::all_gather_descriptors(g, {out.own->pid_tag(), out.own->serial()});
  // Every rank's segments from now on (the same table on every rank).
  for (int r = 0; r < n; ++r) {
    const int gr = g.global_rank(r);
    if (!anew) {
      auto it = specs_.find(gr);
      if (it != specs_.end()) out.specs[gr] = it->second;
    }
    KeepSpec sp = fresh.at(gr);
    const auto k = static_cast<std::size_t>(r);
    sp.name = "/dopt-" + std::to_string(names.at(k, 0)) + "-keep" + std::to_string(names.at(k, 1));
    out.specs[gr].push_back(std::move(sp));
  }
  std::map<std::string, std::shared_ptr<HostKeep>> mapped;  // reuse what this rank maps already
  for (const auto& [t, ks] : buddy_keeps_)
    for (const auto& k : ks) mapped[k->name()] = k;
  std::string failed;
  int bad = -1;
  for (int t = 0; t < n; ++t) {
    const auto& bs = table[static_cast<std::size_t>(t)];
    if (t == me || std::find(bs.begin(), bs.end(), me) == bs.end()) continue;
    auto& v = out.buddies[t];
    for (const auto& sp : out.specs.at(g.global_rank(t))) {
      auto it = mapped.find(sp.name);
      if (it != mapped.end()) {
        v.push_back(it->second);
        continue;
      }
      try {
        v.push_back(HostKeep::open(sp.name, plan_of(z, sp)));
      } catch (const Error& e) {
        if (failed.empty()) {
          failed = e.what();
          bad = t;
        }
      }
    }
  }
  const auto verdicts = detail::all_gather_descriptors(g, {bad});
  for (int r = 0; r < n; ++r) {
    const auto b = verdicts.at(static_cast<std::size_t>(r), 0);
    if (b < 0) continue;
    throw IOError(kName,
                  "host_memory redundancy: rank " + std::to_string(g.global_rank(r)) +
                      " cannot map the shared memory that holds rank " + std::to_string(g.global_rank(static_cast<int>(b))) +
                      "'s shard" + (r == me ? " (" + failed + ")" : std::string()) +
                      "; ZeroBuddyUpdate::host_memory needs every rank's buddies on its host, in the same IPC "
                      "namespace (the same /dev/shm). Use ZeroBuddyUpdate::step across hosts or containers");
  }
  return out;
}

void HostMemoryBuddies::install(ZeroCore& z, KeepShare share, bool anew) {
  if (anew) keeps_.clear();
  keeps_.push_back(std::move(share.own));
  buddy_keeps_ = std::move(share.buddies);
  specs_ = std::move(share.specs);
  keep_index_.clear();
  for (std::size_t s = 0; s < keeps_.size(); ++s)
    for (std::size_t i = 0; i < keeps_[s]->plan().params.size(); ++i)
      keep_index_[z.params.at(static_cast<std::size_t>(keeps_[s]->plan().params[i].global)).key()] = {s, i};
  if (anew)  // this rank's buckets are the segment's
    z.buckets.build(z.part, z.rank, z.repoint, [this](std::size_t kind) { return keeps_.back()->bucket(kind); });
  // The state of the new segment's parameters goes in (older segments hold theirs).
  HostKeep& k = *keeps_.back();
  for (std::size_t i = 0; i < k.plan().params.size(); ++i) adopt_own(z, k, i);
  k.mark_ready();
  plan_reads(z);
  z.optim->set_update_hook([this, &z](const OptimizerOptions&, const Tensor& p, const Tensor& g, ParamState& st,
                                   const Optimizer::UpdateFn& run) {
    auto it = keep_index_.find(p.key());
    if (it == keep_index_.end()) return run(p, g, st);
    std::function<void(int)> after;
    if (z.probe)
      after = [&z](int c) {
        if (c < 0) z.probe_at("committing", 0);
        else z.probe_at("chunk", c);
      };
    keeps_[it->second.first]->update(it->second.second, z.steps + 1, p, g, st, run, after);
  });
}

void HostMemoryBuddies::plan_reads(const ZeroCore& z) {
  // Every rank decides alike: from the buddy table, which every rank derives
  // from the same host map. One host: every other rank is every rank's buddy.
  reads_.clear();
  reads_direct_ = z.world > 1;
  for (const auto& b : table_)
    if (b.size() != static_cast<std::size_t>(z.world - 1)) reads_direct_ = false;
  // Ranks that are threads of one process (simulated) broadcast: the plane
  // then copies straight from the owner's tensors already. Alike on every
  // rank: some rank sees another process exactly when not all are one.
  bool other_process = false;
  const std::string mine = "/dopt-" + std::to_string(::getpid()) + "-";
  for (const auto& [r, ks] : buddy_keeps_)
    for (const auto& k : ks) other_process = other_process || k->name().rfind(mine, 0) != 0;
  reads_direct_ = reads_direct_ && other_process;
  if (!reads_direct_) return;
  for (int r = 0; r < z.world; ++r) {
    if (r == z.rank) continue;
    auto it = buddy_keeps_.find(r);
    std::map<std::int64_t, std::pair<const HostKeep*, std::size_t>> where;  // global index -> newest segment
    if (it != buddy_keeps_.end())
      for (const auto& kp : it->second)
        for (std::size_t i = 0; i < kp->plan().params.size(); ++i)
          if (kp->plan().params[i].p_offset >= 0) where[kp->plan().params[i].global] = {kp.get(), i};
    for (const auto& g : z.part.of(r))
      for (const auto& p : g) {
        if (!p.requires_grad()) continue;  // not in a bucket: not broadcast either
        auto w = where.find(z.params.index_of(p));
        if (w == where.end())
          throw StateError(kName, "host_memory redundancy: rank " + std::to_string(r) +
                                                   "'s segments do not hold its parameter " +
                                                   std::to_string(z.params.index_of(p)) + " (internal error)",
                           z.rank);
        Tensor from = w->second.first->param_values(w->second.second);
        if (p.nbytes() != from.nbytes() || p.dtype() != from.dtype())  // (every Tensor is contiguous)
          throw StateError(kName, "host_memory redundancy: parameter " +
                                                   std::to_string(z.params.index_of(p)) +
                                                   " does not match its copy in rank " + std::to_string(r) +
                                                   "'s segment (internal error)",
                           z.rank);
        reads_.push_back({r, std::move(from), p});
      }
  }
}

void HostMemoryBuddies::read_params(ZeroCore& z) {
  z.group.barrier();
  int last = -1, n = 0;
  for (const auto& rd : reads_) {
    if (rd.owner != last && z.probe) z.probe_at("broadcast", n++);  // as the broadcasts: one per owner
    last = rd.owner;
    std::memcpy(rd.to.data_ptr(), rd.from.data_ptr(), rd.to.nbytes());
  }
  z.group.barrier();
}

void HostMemoryBuddies::share_anew(ZeroCore& z) {
  std::map<int, KeepSpec> fresh;
  for (int r = 0; r < z.world; ++r) fresh[z.group.global_rank(r)] = full_spec(z, r);
  install(z, share(z, z.group, table_, fresh, /*anew=*/true), /*anew=*/true);
  note_small_pages(z);
}

void HostMemoryBuddies::note_small_pages(const ZeroCore& z) const {
  // One note per host: its lowest rank looks at its own segments.
  const auto& mates = table_[static_cast<std::size_t>(z.rank)];
  if (!std::all_of(mates.begin(), mates.end(), [&](int b) { return b > z.rank; })) return;
  constexpr std::size_t kAtLeast = std::size_t{4} << 20;  // smaller segments hardly miss the TLB
  if (!shm::huge_pages_advised()) return;  // DOPT_HUGEPAGES=0: small pages on purpose
  for (const auto& k : keeps_) {
    if (k->segment().size() < kAtLeast || k->segment().huge_page_bytes() > 0) continue;
    const std::string mode = shm::dev_shm_huge_mode();
    const bool off = mode.empty() || mode == "never";
    notice(std::string(kName) + " [rank " + std::to_string(z.rank) +
           "]: host_memory: the shards' shared memory got 4 KiB pages, not 2 MiB ones (" +
           (mode.empty()                          ? std::string("/dev/shm is mounted elsewhere")
            : mode == "deny" || mode == "force" ? "transparent_hugepage/shmem_enabled is " + mode
                                                : "/dev/shm is mounted with huge=" + mode) +
           (off ? "), so step() can run some 5-15% slower than over private memory; as root, "
                  "`mount -o remount,huge=advise /dev/shm` gives it huge pages"
                : "; the kernel had none to give: memory too fragmented, or transparent huge pages off), so "
                  "step() can run some 5-15% slower than over private memory") +
           " (docs/fault-tolerance-optimizers.md, \"Huge pages\")");
    return;
  }
}

void HostMemoryBuddies::adopt_all(ZeroCore& z) {
  for (auto& k : keeps_) k->mark_ready(false);  // a loss meanwhile: the shard is not whole in any segment
  for (const auto& [key, where] : keep_index_) adopt_own(z, *keeps_[where.first], where.second);
  for (auto& k : keeps_) k->mark_ready(true);
}

void HostMemoryBuddies::adopt_own(ZeroCore& z, HostKeep& k, std::size_t i) {
  auto it = z.optim->state().find(z.params.at(static_cast<std::size_t>(k.plan().params[i].global)).key());
  ParamState none;
  k.adopt(i, it != z.optim->state().end() ? it->second : none);
}

StateByParam HostMemoryBuddies::rebuild(const ZeroCore& z, int o, bool in_step) {
  std::unordered_map<const TensorImpl*, ParamState> out;
  auto it = buddy_keeps_.find(o);
  if (it == buddy_keeps_.end())
    throw StateError(kName, "host_memory redundancy: this rank does not map rank " + std::to_string(o) +
                                             "'s segments", z.rank);
  for (const auto& kp : it->second) {
    const HostKeep& k = *kp;
    for (std::size_t i = 0; i < k.plan().params.size(); ++i) {
      const Tensor& p = z.params.at(static_cast<std::size_t>(k.plan().params[i].global));
      const std::size_t group = k.plan().params[i].group;
      auto run = [&](const Tensor& q, const Tensor& grad, ParamState& sub) {
        q.set_grad(grad.clone());
        std::vector<OptimizerParamGroup> gs;
        gs.emplace_back(std::vector<Tensor>{q}, z.params.groups()[group].options->clone());
        auto tmp = make_optimizer(z.spec, std::move(gs));
        if (!sub.empty()) tmp->state()[q.key()] = sub;
        tmp->step();
        sub = tmp->state()[q.key()];
      };
      ParamState st = k.rebuild(i, z.steps + 1, in_step, p, run);
      if (!st.empty()) out[p.key()] = std::move(st);
    }
  }
  return out;
}

// --- the Redundancy and recovery points -----------------------------------------

std::vector<std::vector<int>> HostMemoryBuddies::table_for(const std::vector<std::string>& hosts, int k) const {
  // Every other rank of the host maps the segments (k only turns it on).
  return k > 0 ? choose_buddies_on_host(hosts) : std::vector<std::vector<int>>(hosts.size());
}

void HostMemoryBuddies::setup(ZeroCore& z) {
  if (k(z.world) == 0) return;
  const auto& members = z.group.ranks();
  for (int r = 0; r < z.world; ++r)
    if (table_[static_cast<std::size_t>(r)].empty())
      throw ValueError(kName, "ZeroBuddyUpdate::host_memory keeps each rank's shard in shared memory on its host, "
                              "but rank " + std::to_string(members[static_cast<std::size_t>(r)]) +
                                  " is alone on its host; use ZeroBuddyUpdate::step (buddies on other hosts)",
                       z.rank);
}

void HostMemoryBuddies::build_buckets(ZeroCore& z) { share_anew(z); }

void HostMemoryBuddies::sync_shards(ZeroCore& z, const std::function<void()>& meanwhile) {
  if (reads_direct_) return read_params(z);  // never with a `meanwhile` (replay only)
  Buddies::sync_shards(z, meanwhile);
}

bool HostMemoryBuddies::keeps_state_of(const ZeroCore& z, std::size_t i) const { return z.part.owner(i) == z.rank; }

void HostMemoryBuddies::install_state(ZeroCore& z, StateByParam local) {
  z.optim->state() = std::move(local);
  if (!keeps_.empty()) adopt_all(z);  // the loaded state is the shard's now, in its segments
}

void HostMemoryBuddies::lost_shards(ZeroCore& z, const Loss& loss, bool in_step) {
  // Every rank that maps a lost owner's segment rebuilds the shard from it
  // (its parameters end at the step in flight). Once per owner: a retry
  // after a further loss finds this rank's parameters of the shard already
  // at the step in flight.
  rebuilt_.clear();
  for (std::size_t o = 0; o < loss.new_rank.size(); ++o) {
    const int oo = static_cast<int>(o);
    if (loss.new_rank[o] >= 0 || !buddy_keeps_.count(oo)) continue;
    if (!rebuilt_by_owner_.count(oo)) rebuilt_by_owner_[oo] = rebuild(z, oo, in_step);
    for (const auto& [key, st] : rebuilt_by_owner_[oo]) rebuilt_[key] = st;
  }
}

bool HostMemoryBuddies::rebuilt_everywhere(const Loss& loss, int o, int old_world) const {
  // A lost owner whose every survivor mapped its segment: each of them rebuilt the same values.
  if (loss.new_rank[static_cast<std::size_t>(o)] >= 0) return false;
  const auto& bs = loss.old_table[static_cast<std::size_t>(o)];
  for (int r = 0; r < old_world; ++r)
    if (r != o && loss.new_rank[static_cast<std::size_t>(r)] >= 0 && std::find(bs.begin(), bs.end(), r) == bs.end())
      return false;
  return true;
}

void HostMemoryBuddies::add_available(const Loss&, StateByParam& avail) const {
  for (const auto& [k, st] : rebuilt_) avail[k] = st;
}

bool HostMemoryBuddies::prepare(ZeroCore& z, ProcessGroup& ng, const std::vector<std::vector<int>>& new_table,
                                const std::vector<Kind>& kinds,
                                const std::vector<std::vector<std::vector<Tensor>>>& moved, const Loss& loss,
                                bool keep_anew) {
  // Each survivor's new segment, mapped by its new buddies (a loss here
  // retries from the old group like any other). It holds what the survivor
  // takes over (its row of the new buckets, and the state of frozen
  // parameters it takes over); what it kept stays in its older segments.
  // With other trainable parameters: one segment anew.
  std::map<int, KeepSpec> fresh;
  const int nw = ng.size();
  for (int r = 0; r < nw; ++r) {
    KeepSpec sp;
    if (keep_anew) {
      sp = full_spec(z, r);
    } else {
      for (const auto& kd : kinds) sp.bucket_dtypes.push_back(kd.second);
      const auto& mr = moved[static_cast<std::size_t>(r)];
      for (std::size_t k = 0; k < mr.size(); ++k)
        for (const auto& p : mr[k]) {
          sp.params.push_back(z.params.index_of(p));
          sp.kind.push_back(static_cast<int>(k));
        }
      for (const auto& p : z.part.shard(r)) {
        const int was = loss.old_owner[static_cast<std::size_t>(z.params.index_of(p))];
        if (loss.new_rank[static_cast<std::size_t>(was)] < 0 && !p.requires_grad()) {
          sp.params.push_back(z.params.index_of(p));
          sp.kind.push_back(-1);
        }
      }
    }
    fresh[ng.global_rank(r)] = std::move(sp);
  }
  share_ = share(z, ng, new_table, fresh, keep_anew);
  return true;
}

Tensor HostMemoryBuddies::receive_buffer(std::int64_t index, const std::string& key, const Shape& shape,
                                         DType dtype) const {
  // Straight into this rank's new segment where it has room for it.
  return share_.own ? share_.own->entry_for(index, key, shape, dtype) : Tensor();
}

void HostMemoryBuddies::commit_buckets(ZeroCore& z, const Loss& loss, bool same_trainable,
                                       const std::vector<Kind>& kinds,
                                       const std::vector<std::vector<std::vector<Tensor>>>& moved, bool keep_anew) {
  // The survivors' buckets stay and the taken-over parameters get a row
  // (this rank's in its new segment); other trainable parameters: install
  // builds them anew, this rank's in its segment.
  if (z.bucket_view && same_trainable) {
    std::shared_ptr<HostKeep> own = share_.own;
    z.buckets.keep_and_add(loss.new_rank, z.world, kinds, moved, z.rank, z.repoint,
                           [own](std::size_t kind) { return own ? own->bucket(kind) : Tensor(); });
  }
  // The lost ranks' segments are rebuilt from: their names go (the mappings
  // stay while anything uses them), by their host-mates (the names are the host's).
  for (const auto& [o, ks] : buddy_keeps_)
    if (loss.new_rank[static_cast<std::size_t>(o)] < 0)
      for (const auto& k : ks) k->remove_name();
  install(z, std::move(share_), keep_anew);
  share_ = KeepShare{};
}

}  // namespace dopt::optim::zero_detail
