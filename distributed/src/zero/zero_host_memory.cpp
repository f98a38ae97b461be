// ZeroBuddyUpdate::host_memory, ZeroRedundancyOptimizer's side: the checks,
// the segments' plans, making and exchanging them, the journaling hook and
// the rebuild of a lost owner's shard (the segment itself: zero_host_keep.cpp;
// the design in docs/fault-tolerance.md, "Host memory").
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "survive/agreement.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/internal/shm.hpp"
#include "zero_host_memory.hpp"
#include "zero_internal.hpp"

namespace dopt::optim {

using zero_detail::HostKeep;
using zero_detail::KeepEntry;
using zero_detail::KeepPlan;
using zero_detail::KeepSpec;

void ZeroRedundancyOptimizer::check_host_memory(std::int64_t chunk) {
  const char* why = "ZeroBuddyUpdate::host_memory keeps each rank's shard in shared memory on its host";
  if (chunk < 1 || chunk > (std::int64_t{1} << 26))
    throw ValueError(zero_detail::kName, "host_memory_chunk must be in [1, 2^26], got " + std::to_string(chunk), rank_);
  keep_chunk_ = chunk;
  if (!bucket_view_)
    throw ValueError(zero_detail::kName, std::string(why) + ": it needs parameters_as_bucket_view=true (this rank's "
                                         "bucket is in that memory)", rank_);
  if (!zero_detail::elementwise_optimizer(spec_.name))
    throw NotSupportedError(zero_detail::kName, std::string(why) + " and updates parameters in pieces, which " +
                                                    spec_.name + " does not allow (its update of an element depends "
                                                    "on others); use ZeroBuddyUpdate::step", rank_);
  for (const auto& p : all_params_)
    if (!p.device().is_cpu())
      throw NotSupportedError(zero_detail::kName, std::string(why) + ": parameters on " + p.device().str() +
                                                      " are not supported (CPU only); use ZeroBuddyUpdate::step",
                              rank_);
}

KeepSpec ZeroRedundancyOptimizer::full_keep_spec(int r) const {
  // The kinds of the buckets, as build_buckets orders them.
  std::vector<std::pair<Device, DType>> kinds;
  auto kind_of = [&](const Tensor& p) -> int {
    for (std::size_t k = 0; k < kinds.size(); ++k)
      if (kinds[k].first == p.device() && kinds[k].second == p.dtype()) return static_cast<int>(k);
    kinds.emplace_back(p.device(), p.dtype());
    return static_cast<int>(kinds.size() - 1);
  };
  for (const auto& rank_groups : partition_)
    for (const auto& g : rank_groups)
      for (const auto& p : g) kind_of(p);
  KeepSpec spec;
  for (const auto& k : kinds) spec.bucket_dtypes.push_back(k.second);
  for (const auto& g : partition_[static_cast<std::size_t>(r)])
    for (const auto& p : g) {
      spec.params.push_back(index_of_.at(p.key()));
      spec.kind.push_back(p.requires_grad() ? kind_of(p) : -1);
    }
  return spec;
}

KeepPlan ZeroRedundancyOptimizer::keep_plan(const KeepSpec& spec) {
  KeepPlan plan;
  plan.chunk = keep_chunk_;
  std::vector<std::size_t> group_of;  // by global index
  for (std::size_t g = 0; g < groups_.size(); ++g) group_of.insert(group_of.end(), groups_[g].params.size(), g);
  std::map<std::pair<std::size_t, int>, std::size_t> layout_index;
  plan.bucket_elems.assign(spec.bucket_dtypes.size(), 0);
  for (std::size_t j = 0; j < spec.params.size(); ++j) {
    const Tensor& p = all_params_[static_cast<std::size_t>(spec.params[j])];
    const std::size_t g = group_of[static_cast<std::size_t>(spec.params[j])];
    const std::pair<std::size_t, int> key{g, static_cast<int>(p.dtype())};
    auto lit = keep_layouts_.find(key);
    if (lit == keep_layouts_.end()) {
      // One step of the optimizer on a probe of two elements: its state entries.
      Tensor x = Tensor::zeros({2}, p.dtype());
      x.set_grad(Tensor::full({2}, 0.5, p.dtype()));
      std::vector<OptimizerParamGroup> gs;
      gs.emplace_back(std::vector<Tensor>{x}, groups_[g].options->clone());
      auto opt = make_optimizer(spec_, std::move(gs));
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
            throw NotSupportedError(zero_detail::kName, "host_memory redundancy: state entry '" + name + "' of " +
                                                            spec_.name + " is neither per element nor a scalar",
                                    rank_);
        }
        entries.push_back(std::move(e));
      }
      lit = keep_layouts_.emplace(key, std::move(entries)).first;
    }
    auto [it, fresh] = layout_index.emplace(key, plan.layouts.size());
    if (fresh) plan.layouts.push_back(lit->second);
    zero_detail::KeepParam kp;
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

zero_detail::KeepShare ZeroRedundancyOptimizer::share_keeps(ProcessGroup& g,
                                                            const std::vector<std::vector<int>>& table,
                                                            const std::map<int, KeepSpec>& fresh, bool anew) {
  const int me = g.rank(), n = g.size();
  zero_detail::KeepShare out;
  out.own = HostKeep::create(keep_plan(fresh.at(g.global_rank(me))));
  const auto names = detail::all_gather_descriptors(g, {out.own->pid_tag(), out.own->serial()});
  // Every rank's segments from now on (the same table on every rank).
  for (int r = 0; r < n; ++r) {
    const int gr = g.global_rank(r);
    if (!anew) {
      auto it = keep_specs_.find(gr);
      if (it != keep_specs_.end()) out.specs[gr] = it->second;
    }
    KeepSpec sp = fresh.at(gr);
    const auto& d = names[static_cast<std::size_t>(r)];
    sp.name = "/dopt-" + std::to_string(d[0]) + "-keep" + std::to_string(d[1]);
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
        v.push_back(HostKeep::open(sp.name, keep_plan(sp)));
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
    const auto b = verdicts[static_cast<std::size_t>(r)][0];
    if (b < 0) continue;
    throw IOError(zero_detail::kName,
                  "host_memory redundancy: rank " + std::to_string(g.global_rank(r)) +
                      " cannot map the shared memory that holds rank " + std::to_string(g.global_rank(static_cast<int>(b))) +
                      "'s shard" + (r == me ? " (" + failed + ")" : std::string()) +
                      "; ZeroBuddyUpdate::host_memory needs every rank's buddies on its host, in the same IPC "
                      "namespace (the same /dev/shm). Use ZeroBuddyUpdate::step across hosts or containers");
  }
  return out;
}

void ZeroRedundancyOptimizer::install_keeps(zero_detail::KeepShare share, bool anew) {
  if (anew) keeps_.clear();
  keeps_.push_back(std::move(share.own));
  buddy_keeps_ = std::move(share.buddies);
  keep_specs_ = std::move(share.specs);
  keep_index_.clear();
  for (std::size_t s = 0; s < keeps_.size(); ++s)
    for (std::size_t i = 0; i < keeps_[s]->plan().params.size(); ++i)
      keep_index_[all_params_[static_cast<std::size_t>(keeps_[s]->plan().params[i].global)].key()] = {s, i};
  if (anew) build_buckets();  // this rank's buckets are the segment's
  // The state of the new segment's parameters goes in (older segments hold theirs).
  HostKeep& k = *keeps_.back();
  for (std::size_t i = 0; i < k.plan().params.size(); ++i) adopt_own_state(k, i);
  k.mark_ready();
  plan_keep_reads();
  optim_->set_update_hook([this](const OptimizerOptions&, const Tensor& p, const Tensor& g, ParamState& st,
                                 const Optimizer::UpdateFn& run) {
    auto it = keep_index_.find(p.key());
    if (it == keep_index_.end()) return run(p, g, st);
    std::function<void(int)> after;
    if (probe_)
      after = [this](int c) {
        if (c < 0) probe_("committing", steps_, 0);
        else probe_("chunk", steps_, c);
      };
    keeps_[it->second.first]->update(it->second.second, steps_ + 1, p, g, st, run, after);
  });
}

void ZeroRedundancyOptimizer::plan_keep_reads() {
  // Every rank decides alike: from the buddy table, which every rank derives
  // from the same host map. One host: every other rank is every rank's buddy.
  keep_reads_.clear();
  keep_reads_direct_ = world_size_ > 1;
  for (const auto& b : buddy_table_)
    if (b.size() != static_cast<std::size_t>(world_size_ - 1)) keep_reads_direct_ = false;
  // Ranks that are threads of one process (simulated) broadcast: the plane
  // then copies straight from the owner's tensors already. Alike on every
  // rank: some rank sees another process exactly when not all are one.
  bool other_process = false;
  const std::string mine = "/dopt-" + std::to_string(::getpid()) + "-";
  for (const auto& [r, ks] : buddy_keeps_)
    for (const auto& k : ks) other_process = other_process || k->name().rfind(mine, 0) != 0;
  keep_reads_direct_ = keep_reads_direct_ && other_process;
  if (!keep_reads_direct_) return;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    auto it = buddy_keeps_.find(r);
    std::map<std::int64_t, std::pair<const HostKeep*, std::size_t>> where;  // global index -> newest segment
    if (it != buddy_keeps_.end())
      for (const auto& kp : it->second)
        for (std::size_t i = 0; i < kp->plan().params.size(); ++i)
          if (kp->plan().params[i].p_offset >= 0) where[kp->plan().params[i].global] = {kp.get(), i};
    for (const auto& g : partition_[static_cast<std::size_t>(r)])
      for (const auto& p : g) {
        if (!p.requires_grad()) continue;  // not in a bucket: not broadcast either
        auto w = where.find(index_of_.at(p.key()));
        if (w == where.end())
          throw StateError(zero_detail::kName, "host_memory redundancy: rank " + std::to_string(r) +
                                                   "'s segments do not hold its parameter " +
                                                   std::to_string(index_of_.at(p.key())) + " (internal error)",
                           rank_);
        Tensor from = w->second.first->param_values(w->second.second);
        if (p.nbytes() != from.nbytes() || p.dtype() != from.dtype())  // (every Tensor is contiguous)
          throw StateError(zero_detail::kName, "host_memory redundancy: parameter " +
                                                   std::to_string(index_of_.at(p.key())) +
                                                   " does not match its copy in rank " + std::to_string(r) +
                                                   "'s segment (internal error)",
                           rank_);
        keep_reads_.push_back({r, std::move(from), p});
      }
  }
}

void ZeroRedundancyOptimizer::read_params_from_keeps() {
  group_.barrier();
  int last = -1, n = 0;
  for (const auto& rd : keep_reads_) {
    if (rd.owner != last && probe_) probe_("broadcast", steps_, n++);  // as the broadcasts: one per owner
    last = rd.owner;
    std::memcpy(rd.to.data_ptr(), rd.from.data_ptr(), rd.to.nbytes());
  }
  group_.barrier();
}

void ZeroRedundancyOptimizer::share_keeps_anew() {
  std::map<int, KeepSpec> fresh;
  for (int r = 0; r < world_size_; ++r) fresh[group_.global_rank(r)] = full_keep_spec(r);
  install_keeps(share_keeps(group_, buddy_table_, fresh, /*anew=*/true), /*anew=*/true);
  note_small_pages();
}

void ZeroRedundancyOptimizer::note_small_pages() const {
  // One note per host: its lowest rank looks at its own segments.
  const auto& mates = buddy_table_[static_cast<std::size_t>(rank_)];
  if (!std::all_of(mates.begin(), mates.end(), [&](int b) { return b > rank_; })) return;
  constexpr std::size_t kAtLeast = std::size_t{4} << 20;  // smaller segments hardly miss the TLB
  if (!shm::huge_pages_advised()) return;  // DOPT_HUGEPAGES=0: small pages on purpose
  for (const auto& k : keeps_) {
    if (k->segment().size() < kAtLeast || k->segment().huge_page_bytes() > 0) continue;
    const std::string mode = shm::dev_shm_huge_mode();
    const bool off = mode.empty() || mode == "never";
    notice(std::string(zero_detail::kName) + " [rank " + std::to_string(rank_) +
           "]: host_memory: the shards' shared memory got 4 KiB pages, not 2 MiB ones (" +
           (mode.empty()                          ? std::string("/dev/shm is mounted elsewhere")
            : mode == "deny" || mode == "force" ? "transparent_hugepage/shmem_enabled is " + mode
                                                : "/dev/shm is mounted with huge=" + mode) +
           (off ? "), so step() can run some 5-15% slower than over private memory; as root, "
                  "`mount -o remount,huge=advise /dev/shm` gives it huge pages"
                : "; the kernel had none to give: memory too fragmented, or transparent huge pages off), so "
                  "step() can run some 5-15% slower than over private memory") +
           " (docs/fault-tolerance.md, \"Huge pages\")");
    return;
  }
}

void ZeroRedundancyOptimizer::adopt_into_keeps() {
  for (auto& k : keeps_) k->mark_ready(false);  // a loss meanwhile: the shard is not whole in any segment
  for (const auto& [key, where] : keep_index_) adopt_own_state(*keeps_[where.first], where.second);
  for (auto& k : keeps_) k->mark_ready(true);
}

void ZeroRedundancyOptimizer::adopt_own_state(HostKeep& k, std::size_t i) {
  auto it = optim_->state().find(all_params_[static_cast<std::size_t>(k.plan().params[i].global)].key());
  ParamState none;
  k.adopt(i, it != optim_->state().end() ? it->second : none);
}

std::unordered_map<const TensorImpl*, ParamState> ZeroRedundancyOptimizer::rebuild_from_keep(int o, bool in_step) {
  std::unordered_map<const TensorImpl*, ParamState> out;
  auto it = buddy_keeps_.find(o);
  if (it == buddy_keeps_.end())
    throw StateError(zero_detail::kName, "host_memory redundancy: this rank does not map rank " + std::to_string(o) +
                                             "'s segments", rank_);
  for (const auto& kp : it->second) {
    const HostKeep& k = *kp;
    for (std::size_t i = 0; i < k.plan().params.size(); ++i) {
      const Tensor& p = all_params_[static_cast<std::size_t>(k.plan().params[i].global)];
      const std::size_t group = k.plan().params[i].group;
      auto run = [&](const Tensor& q, const Tensor& grad, ParamState& sub) {
        q.set_grad(grad.clone());
        std::vector<OptimizerParamGroup> gs;
        gs.emplace_back(std::vector<Tensor>{q}, groups_[group].options->clone());
        auto tmp = make_optimizer(spec_, std::move(gs));
        if (!sub.empty()) tmp->state()[q.key()] = sub;
        tmp->step();
        sub = tmp->state()[q.key()];
      };
      ParamState st = k.rebuild(i, steps_ + 1, in_step, p, run);
      if (!st.empty()) out[p.key()] = std::move(st);
    }
  }
  return out;
}

}  // namespace dopt::optim
