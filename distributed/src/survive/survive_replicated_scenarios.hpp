#pragma once
// Test support (not installed): the post-local SGD and Reducer scenarios of
// surviving a lost rank, shared by distributed/src/survive/survive_replicated.test.cpp
// (simulated ranks) and tests/survive_replicated_peer.cpp (processes). The
// reference run is described in survive_replicated.test.cpp.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/registry.hpp"
#include "zero/zero_survive_reference.hpp"

namespace dopt::survive_test {

using namespace dopt::optim;


using dopt::optim::survive_reference::grad_elem;  // a multiple of 1/256: exact in float32 and float64
using dopt::optim::survive_reference::mix64;

inline double init_elem(std::size_t i, std::int64_t k) {
  const std::uint64_t h = mix64(mix64(1000003ull + i) + static_cast<std::uint64_t>(k));
  return static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

inline const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300, 1, 7001, 12};

/// Parameter 2 is float64 when `mixed` (post-local SGD: two all-reduces).
inline std::vector<Tensor> make_params(bool mixed) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    const DType dt = mixed && i == 2 ? DType::float64 : DType::float32;
    Tensor p = Tensor::zeros({kSizes[i]}, dt);
    for (std::int64_t k = 0; k < kSizes[i]; ++k) {
      if (dt == DType::float64) p.data<double>()[k] = init_elem(i, k);
      else p.data<float>()[k] = static_cast<float>(init_elem(i, k));
    }
    p.set_requires_grad(true);
    ps.push_back(p);
  }
  return ps;
}

inline void set_grads(const std::vector<Tensor>& ps, int r, std::int64_t t) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    Tensor g = Tensor::zeros(ps[i].shape(), ps[i].dtype());
    for (std::int64_t k = 0; k < kSizes[i]; ++k) {
      if (g.dtype() == DType::float64) g.data<double>()[k] = static_cast<double>(grad_elem(r, t, i, k));
      else g.data<float>()[k] = grad_elem(r, t, i, k);
    }
    ps[i].set_grad(g);
  }
}

inline std::vector<std::vector<unsigned char>> bytes_of(const std::vector<Tensor>& ps) {
  std::vector<std::vector<unsigned char>> out;
  for (const auto& p : ps) {
    const auto* b = static_cast<const unsigned char*>(p.data_ptr());
    out.emplace_back(b, b + p.nbytes());
  }
  return out;
}

inline std::string ranks_str(const std::vector<int>& r) {
  std::string s;
  for (int x : r) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

/// A further loss (Scenario::more): "before" or "during" step `step`.
struct Loss {
  int victim = 1;
  std::int64_t step = 2;
  std::string point;
};

struct Scenario {
  int n = 3;
  int victim = 1;
  std::int64_t step = 2;   // the step at which it is lost
  std::string point;       // "before", "during", "after"; "" for no loss
  std::int64_t steps = 6;
  bool callback = false;
  std::int64_t change_at = -1;  // C of the header
  /// Further losses ("before" or "during"; the first loss alone may be
  /// "after"), each applied in the reference at its own C.
  std::vector<Loss> more;
  /// A rank lost at the start of the survivors' recovery of the first loss
  /// (simulated only: the test's recovery probe); -1: none. The reference
  /// removes it with the first loss.
  int die_in_recovery = -1;
};

/// Every loss of sc: the first, `more`, and the loss during its recovery
/// (point "recovery", at the first loss's step).
inline std::vector<Loss> losses(const Scenario& sc) {
  std::vector<Loss> out;
  if (sc.point.empty()) return out;
  out.push_back(Loss{sc.victim, sc.step, sc.point});
  out.insert(out.end(), sc.more.begin(), sc.more.end());
  if (sc.die_in_recovery >= 0) out.push_back(Loss{sc.die_in_recovery, sc.step, "recovery"});
  return out;
}

/// The loss of rank `me`, or null.
inline const Loss* loss_of(const std::vector<Loss>& ls, int me) {
  for (const auto& l : ls)
    if (l.victim == me) return &l;
  return nullptr;
}

struct RankResult {
  bool done = false;
  std::vector<std::vector<unsigned char>> params;
  std::string log;
  int final_size = 0;
};

inline std::vector<int> survivors(const Scenario& sc) {
  const auto ls = losses(sc);
  std::vector<int> s;
  for (int r = 0; r < sc.n; ++r)
    if (!loss_of(ls, r)) s.push_back(r);
  return s;
}

/// A membership change of the reference run: from step `at` on, `alive`.
struct Change {
  std::int64_t at = 0;
  std::vector<int> alive;
};

/// The reference's changes: each loss applied at change_at(loss) (the first
/// loss, and the loss during its recovery, at sc.change_at when it is set).
inline std::vector<Change> changes(const Scenario& sc, const std::function<std::int64_t(const Loss&)>& change_at) {
  std::map<std::int64_t, std::vector<int>> by_step;
  const auto ls = losses(sc);
  for (std::size_t i = 0; i < ls.size(); ++i) {
    const bool first = i == 0 || ls[i].point == "recovery";
    by_step[first && sc.change_at >= 0 ? sc.change_at : change_at(ls[i])].push_back(ls[i].victim);
  }
  std::vector<Change> out;
  std::vector<int> gone;
  for (const auto& [at, vs] : by_step) {
    gone.insert(gone.end(), vs.begin(), vs.end());
    Change c;
    c.at = at;
    for (int r = 0; r < sc.n; ++r)
      if (std::find(gone.begin(), gone.end(), r) == gone.end()) c.alive.push_back(r);
    out.push_back(c);
  }
  return out;
}

/// How the lost rank dies and what the survivors' runs need: simulated
/// ranks throw, processes kill themselves.
struct Hooks {
  /// Never returns.
  std::function<void()> die;
  /// Keeps what the dying rank posted alive (tensors, a future), simulated only.
  std::function<void(std::vector<Tensor>, Future<void>)> keep = [](std::vector<Tensor>, Future<void>) {};
  /// Every rank calls it when it finished the scenario's step.
  std::function<void()> arrive = [] {};
  /// "after": the lost rank waits here until every rank finished that step.
  std::function<void()> wait_all = [] {};
};

/// A recovery in a rank's log: "<what> lost=<ranks> step=<step>;"
/// (" completed" before the ';' when `completed`).
inline std::string recovery_entry(const char* what, const ZeroRecovery& r, bool completed = false) {
  return std::string(what) + " lost=" + ranks_str(r.lost) + " step=" + std::to_string(r.step) +
         (completed ? " completed" : "") + ";";
}

/// Whether rank `me` of sc is lost at step t at `point` ("before", "during", "after").
struct LossPoint {
  std::optional<Loss> lost;
  LossPoint(const Scenario& sc, int me) {
    const auto ls = losses(sc);
    if (const Loss* l = loss_of(ls, me)) lost = *l;
  }
  bool operator()(std::int64_t t, const char* point) const { return lost && t == lost->step && lost->point == point; }
};

/// Runs fn over n simulated ranks for a reference run.
inline void simulate_ranks(int n, const std::function<void(RankContext&)>& fn) {
  SimulateOptions so;
  so.timeout = std::chrono::seconds(30);
  simulate(n, fn, so);
}

/// The reference run of sc without a crash: sc.n simulated ranks, each
/// with make_params(mixed) and a Rank(params, world) over them; from each
/// change of chs on, the ranks it keeps go on in a group of their own (made
/// up front, by every rank of the world) and call rank.regroup(group) before
/// that step's gradients, the others stop; rank.step(t, group) runs step t
/// once its gradients are set. Each rank's result: its parameters and the
/// size of its last group.
template <class Rank>
inline std::vector<RankResult> reference_run(const Scenario& sc, const std::vector<Change>& chs, bool mixed) {
  std::vector<RankResult> res(static_cast<std::size_t>(sc.n));
  std::mutex mu;
  simulate_ranks(sc.n, [&](RankContext& ctx) {
    const int me = ctx.rank();
    RankResult out;
    ProcessGroup world = ctx.world();
    ProcessGroup group = world;
    std::vector<ProcessGroup> subgroups;
    for (const auto& c : chs) subgroups.push_back(world.new_group(c.alive));  // every rank of the world
    auto params = make_params(mixed);
    Rank rank(params, world);
    for (std::int64_t t = 0; t < sc.steps; ++t) {
      for (std::size_t k = 0; k < chs.size(); ++k)
        if (t == chs[k].at) {
          group = subgroups[k];
          if (std::find(chs[k].alive.begin(), chs[k].alive.end(), me) == chs[k].alive.end()) return;
          rank.regroup(group);
        }
      set_grads(params, me, t);
      rank.step(t, group);
    }
    out.done = true;
    out.final_size = group.size();
    out.params = bytes_of(params);
    std::lock_guard<std::mutex> lock(mu);
    res[static_cast<std::size_t>(me)] = std::move(out);
  });
  return res;
}

// --- post-local SGD ------------------------------------------------------------

constexpr std::int64_t kWarmup = 1, kPeriod = 2;  // averages at steps 1, 3, 5
inline bool averages(std::int64_t t) { return t >= kWarmup && (t - kWarmup) % kPeriod == 0; }

inline OptimizerSpec plsgd_inner() { return OptimizerSpec{"SGD", {{"lr", 0.05}, {"momentum", 0.9}}}; }

/// One rank of the survive run (post-local SGD).
inline RankResult plsgd_rank(ProcessGroup world, int me, const Scenario& sc, const Hooks& h) {
  RankResult out;
  auto params = make_params(true);
  PostLocalSGDOptimizer opt(make_optimizer(plsgd_inner(), {OptimizerParamGroup(params)}),
                            std::make_unique<PeriodicModelAverager>(kPeriod, kWarmup, world));
  if (sc.callback)
    opt.enable_survive([&](const ZeroRecovery& r) {
      world = r.group;
      out.log += recovery_entry("callback", r);
    });
  else
    opt.enable_survive();
  const LossPoint at(sc, me);
  for (std::int64_t t = 0; t < sc.steps; ++t) {
    if (at(t, "before")) h.die();
    set_grads(params, me, t);
    if (at(t, "during")) {
      opt.optim().step();
      std::vector<Tensor> f32;
      for (const auto& p : params)
        if (p.dtype() == DType::float32) f32.push_back(p);
      auto f = average_parameters_async(f32, world);  // its float32 share; never the float64 one
      h.keep(params, std::move(f));
      h.die();
    }
    try {
      opt.step();
    } catch (const MembershipChangedError& e) {
      world = e.recovery().group;
      out.log += recovery_entry("changed", e.recovery(), e.recovery().step_completed);
    }
    if (!sc.point.empty() && t == sc.step) h.arrive();
    if (at(t, "after")) {
      h.wait_all();
      h.keep(params, {});
      h.die();
    }
  }
  out.done = true;
  out.final_size = world.size();
  out.params = bytes_of(params);
  return out;
}

inline std::int64_t plsgd_change_at(const Loss& l) {
  std::int64_t c = l.point == "after" ? l.step + 1 : l.step;
  while (!averages(c)) ++c;
  return c;
}

/// A rank of the post-local SGD reference: the inner optimizer, and the
/// average over the rank's group at the averaging steps.
struct PlsgdReferenceRank {
  std::unique_ptr<Optimizer> opt;
  PlsgdReferenceRank(std::vector<Tensor>& params, ProcessGroup&)
      : opt(make_optimizer(plsgd_inner(), {OptimizerParamGroup(params)})) {}
  void regroup(ProcessGroup&) {}
  void step(std::int64_t t, ProcessGroup& group) {
    opt->step();
    if (averages(t)) average_parameters(get_params_to_average(opt->param_groups()), group);
  }
};

inline std::vector<RankResult> plsgd_reference(const Scenario& sc) {
  const auto chs = changes(sc, [](const Loss& l) { return plsgd_change_at(l); });
  return reference_run<PlsgdReferenceRank>(sc, chs, true);
}

inline std::int64_t plsgd_change_at(const Scenario& sc) { return plsgd_change_at(Loss{sc.victim, sc.step, sc.point}); }

// --- Reducer -------------------------------------------------------------------

inline OptimizerSpec ddp_inner() { return OptimizerSpec{"Adam", {{"lr", 0.01}}}; }

inline ReducerOptions small_buckets(bool survive) {
  ReducerOptions ro;
  ro.first_bucket_cap_bytes = 2048;
  ro.bucket_cap_bytes = 16384;
  ro.broadcast_parameters = false;  // the same initial parameters everywhere
  ro.survive = survive;
  return ro;
}

/// One rank of the survive run (Reducer + a local Adam).
inline RankResult reducer_rank(ProcessGroup world, int me, const Scenario& sc, const Hooks& h) {
  RankResult out;
  auto params = make_params(false);
  ReducerOptions ro = small_buckets(true);
  if (sc.callback)
    ro.on_membership_change = [&](const ZeroRecovery& r) {
      world = r.group;
      out.log += recovery_entry("callback", r);
    };
  auto reducer = std::make_unique<Reducer>(params, world, ro);
  if (reducer->num_buckets() < 3) throw std::logic_error("the scenario needs 3 or more buckets");
  auto opt = make_optimizer(ddp_inner(), {OptimizerParamGroup(params)});
  const LossPoint at(sc, me);
  for (std::int64_t t = 0; t < sc.steps; ++t) {
    if (at(t, "before")) h.die();
    set_grads(params, me, t);
    if (at(t, "during")) {
      const auto buckets = reducer->bucket_indices();
      for (auto i : buckets[0]) reducer->mark_ready(params[i]);  // bucket 0 launches
      h.keep(params, {});
      reducer.release();  // its buckets stay alive for the collective it posted
      h.die();
    }
    for (std::size_t i = params.size(); i-- > 0;) reducer->mark_ready(params[i]);  // as a backward pass
    try {
      reducer->finalize();
    } catch (const MembershipChangedError& e) {
      world = e.recovery().group;
      out.log += recovery_entry("changed", e.recovery(), e.recovery().step_completed);
    }
    opt->step();
    if (!sc.point.empty() && t == sc.step) h.arrive();
    if (at(t, "after")) {
      h.wait_all();
      h.die();
    }
  }
  out.done = true;
  out.final_size = world.size();
  out.params = bytes_of(params);
  return out;
}

/// A rank of the Reducer reference: a plain Reducer over the rank's group
/// (a new one for each new group) and the local Adam.
struct ReducerReferenceRank {
  std::vector<Tensor>& params;
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<Optimizer> opt;
  ReducerReferenceRank(std::vector<Tensor>& ps, ProcessGroup& world)
      : params(ps), reducer(std::make_unique<Reducer>(ps, world, small_buckets(false))),
        opt(make_optimizer(ddp_inner(), {OptimizerParamGroup(ps)})) {}
  void regroup(ProcessGroup& group) { reducer = std::make_unique<Reducer>(params, group, small_buckets(false)); }
  void step(std::int64_t, ProcessGroup&) {
    for (std::size_t i = params.size(); i-- > 0;) reducer->mark_ready(params[i]);
    reducer->finalize();
    opt->step();
  }
};

inline std::vector<RankResult> reducer_reference(const Scenario& sc) {
  const auto chs = changes(sc, [](const Loss& l) { return l.point == "after" ? l.step + 1 : l.step; });
  return reference_run<ReducerReferenceRank>(sc, chs, false);
}

}  // namespace dopt::survive_test
