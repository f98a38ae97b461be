#pragma once
// Test support (not installed): DistributedOptimizer with redundancy losing
// owners, shared by distributed/src/rpc_optim/distributed_optimizer_survive.test.cpp
// (simulated workers) and tests/rpc_peer.cpp ("survive", processes).
//
// Workers: rank 0 is the trainer, ranks 1..n-1 own two parameters each
// (indices 2(r-1) and 2(r-1)+1 of the trainer's list). The trainer runs
// `steps` steps of Adam; the gradient of parameter i at step t is a fixed
// function of (i, t, element). Owners are lost at given steps and points:
//   "before"    the trainer has the owner killed before step t's deposits;
//   "begin"     the owner dies at the start of its step t (before it read or
//               forwarded the gradients: they are gone with it);
//   "mirrored"  the owner dies after its step t was applied by itself and by
//               its buddies, before it replied;
//   "after"     the trainer has the owner killed once step t completed;
//   "promote"   a buddy dies while its copy is being taken over (a loss
//               during the recovery; t is the copy's step count).
// The trainer catches OwnersChangedError (or, with `callback`, handles the
// recovery in on_membership_change) and deposits the gradients it names
// again on parameters().
//
// The reference run: one FunctionalOptimizer of the same spec over copies of
// the initial parameters, stepped with the same gradients of every step. It
// is what a DistributedOptimizer computes without any loss (each parameter
// is stepped with its own state and its own gradient by the same kernel,
// whichever worker holds it: the parity tests check that bit for bit), and
// what the survivors must end with: a loss changes where a parameter lives,
// never what is applied to it.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "dopt/optim/registry.hpp"
#include "distributed_optimizer_testing.hpp"

namespace dopt::do_survive_test {

using namespace dopt::optim;

struct Loss {
  int victim = 1;
  std::int64_t step = 2;
  std::string point;  // "before", "begin", "mirrored", "after", "promote"
};

struct Scenario {
  int n = 3;
  int redundancy = 1;
  std::vector<Loss> losses;
  std::int64_t steps = 5;
  bool callback = false;
};

struct Result {
  bool done = false;
  std::vector<std::vector<unsigned char>> params;
  std::vector<int> owners;
  std::string log;
  std::string error;  // "KIND: what" when the trainer's run ended with an error
};

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline float value_of(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  const std::uint64_t h = mix64(mix64(mix64(a) + b) + c);
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

inline std::int64_t param_size(std::size_t i) { return i % 2 == 0 ? 33 + 7 * static_cast<std::int64_t>(i) : 5; }
inline std::size_t num_params(const Scenario& sc) { return static_cast<std::size_t>(2 * (sc.n - 1)); }

inline Tensor initial_param(std::size_t i) {
  Tensor p = Tensor::zeros({param_size(i)});
  for (std::int64_t k = 0; k < param_size(i); ++k) p.data<float>()[k] = value_of(1000 + i, 0, static_cast<std::uint64_t>(k));
  return p;
}
inline std::vector<Tensor> grads_of(const Scenario& sc, std::int64_t t) {
  std::vector<Tensor> gs;
  for (std::size_t i = 0; i < num_params(sc); ++i) {
    Tensor g = Tensor::zeros({param_size(i)});
    for (std::int64_t k = 0; k < param_size(i); ++k)
      g.data<float>()[k] = value_of(i + 1, static_cast<std::uint64_t>(t) + 7, static_cast<std::uint64_t>(k));
    gs.push_back(g);
  }
  return gs;
}

inline OptimizerSpec spec() { return OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.001}}}; }

inline std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* b = static_cast<const unsigned char*>(t.data_ptr());
  return {b, b + t.nbytes()};
}

/// The reference run (see the top of this file).
inline std::vector<std::vector<unsigned char>> reference(const Scenario& sc) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < num_params(sc); ++i) ps.push_back(initial_param(i));
  auto opt = make_functional(spec(), ps);
  for (std::int64_t t = 0; t < sc.steps; ++t) opt->step(grads_of(sc, t));
  std::vector<std::vector<unsigned char>> out;
  for (const auto& p : ps) out.push_back(bytes_of(p));
  return out;
}

/// How a worker dies: simulated workers stop their agent
/// (rpc::testing::kill), processes SIGKILL themselves. Set by the runner.
inline std::function<void(rpc::Agent&)>& die_fn() {
  static std::function<void(rpc::Agent&)> f;
  return f;
}

/// Registers the workers' functions and installs the owners' probe for sc's
/// "begin" and "mirrored" losses. Call in every process before the run.
inline void install(const Scenario& sc) {
  rpc::register_function("dos.make_param", [](std::int64_t i) { return initial_param(static_cast<std::size_t>(i)); });
  rpc::register_function("dos.die", [](rpc::Agent& a) { die_fn()(a); });
  const auto losses = sc.losses;
  optim::detail::set_owner_probe([losses](rpc::Agent& a, const char* point, long step) {
    for (const auto& l : losses)
      if (l.victim == a.rank() && l.step == step && l.point == point) {
        die_fn()(a);
        return true;
      }
    return false;
  });
}

inline std::string list_str(const std::vector<std::size_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

inline std::string ranks_str(const std::vector<rpc::WorkerInfo>& v) {
  std::string s;
  for (const auto& w : v) s += (s.empty() ? "" : ",") + std::to_string(w.rank);
  return s;
}

/// "joined=R,... " for a join (the grow scenarios), then what was lost and moved.
inline std::string describe(const OwnerRecovery& r) {
  std::string s = r.joined.empty() ? "" : "joined=" + ranks_str(r.joined) + " ";
  s += "lost=" + ranks_str(r.lost);
  s += " moved=" + list_str(r.moved) + " needs=" + list_str(r.needs_gradient) + " step=" + std::to_string(r.step) +
       (r.step_completed ? " completed" : "") + ";";
  return s;
}

/// The trainer's side that these scenarios and the grow scenarios
/// (distributed_optimizer_grow_scenarios.hpp) share: the owners' parameters,
/// the options, and step t with sc's "before" and "after" losses and the
/// recovery (OwnersChangedError caught, or the callback; the gradients it
/// names deposited again).
class TrainerLoop {
 public:
  TrainerLoop(rpc::Agent& a, const Scenario& sc, std::string& log) : a_(a), sc_(sc), log_(log) {}
  TrainerLoop(const TrainerLoop&) = delete;
  TrainerLoop& operator=(const TrainerLoop&) = delete;

  /// The parameters: 2(r-1) and 2(r-1)+1 made on owner r.
  std::vector<rpc::RRef<Tensor>> make_params() const {
    std::vector<rpc::RRef<Tensor>> ps;
    for (std::size_t i = 0; i < num_params(sc_); ++i)
      ps.push_back(a_.remote<Tensor>(static_cast<int>(i / 2) + 1, "dos.make_param", static_cast<std::int64_t>(i)));
    return ps;
  }
  /// sc's redundancy, a 20 s timeout; with sc.callback, a callback that logs
  /// the record and deposits the gradients it names (none for a join, or
  /// between steps).
  DistributedOptimizerOptions options() {
    DistributedOptimizerOptions o;
    o.redundancy = sc_.redundancy;
    o.timeout = std::chrono::seconds(20);
    if (sc_.callback)
      o.on_membership_change = [this](const OwnerRecovery& r) {
        log_ += "callback " + describe(r);
        if (!r.joined.empty()) return;
        if (!r.step_completed && !r.needs_gradient.empty()) redeposit(r);
      };
    return o;
  }
  /// Has the trainer kill `victim` and waits until it is seen lost.
  void kill(int victim) const {
    (void)a_.rpc_async(victim, "dos.die");
    if (!a_.wait_until_lost(victim, std::chrono::seconds(20))) throw TimeoutError("test", "the victim did not die");
  }
  /// Step t of opt, with sc's losses at t ("before", "after").
  void step(DistributedOptimizer& opt, std::int64_t t) {
    using rpc::GradContext;
    using rpc::RRef;
    opt_ = &opt;
    for (const auto& l : sc_.losses)
      if (l.step == t && l.point == "before") kill(l.victim);
    GradContext ctx = a_.new_context();
    cur_ = &ctx;
    cur_grads_ = grads_of(sc_, t);
    std::vector<std::pair<RRef<Tensor>, Tensor>> deps;
    for (std::size_t i = 0; i < cur_grads_.size(); ++i) deps.emplace_back(opt.parameters()[i], cur_grads_[i]);
    (void)ctx.deposit_all(deps);
    try {
      opt.step(ctx);
    } catch (const OwnersChangedError& e) {
      log_ += "changed " + describe(e.owner_recovery());
      if (!e.recovery().step_completed) {
        redeposit(e.owner_recovery());
        opt.step(ctx);
      }
    }
    cur_ = nullptr;
    if (opt.step_count() != t + 1) throw StateError("test", "step_count() is " + std::to_string(opt.step_count()));
    for (const auto& l : sc_.losses)
      if (l.step == t && l.point == "after") kill(l.victim);
  }
  /// The final parameters' bytes and the owners' ranks.
  static void finish(const DistributedOptimizer& opt, std::vector<std::vector<unsigned char>>& params,
                     std::vector<int>& owners) {
    for (const auto& p : opt.parameters()) params.push_back(bytes_of(p.to_here()));
    for (const auto& w : opt.owners()) owners.push_back(w.rank);
  }

 private:
  void redeposit(const OwnerRecovery& r) {
    std::vector<std::pair<rpc::RRef<Tensor>, Tensor>> deps;
    for (auto i : r.needs_gradient) deps.emplace_back(opt_->parameters()[i], cur_grads_[i]);
    cur_->deposit_all(deps).get();
  }

  rpc::Agent& a_;
  Scenario sc_;
  std::string& log_;
  DistributedOptimizer* opt_ = nullptr;
  rpc::GradContext* cur_ = nullptr;
  std::vector<Tensor> cur_grads_;
};

/// The trainer (rank 0).
inline Result trainer(rpc::Agent& a, const Scenario& sc) {
  Result out;
  TrainerLoop loop(a, sc, out.log);
  try {
    DistributedOptimizer opt(a, spec(), loop.make_params(), loop.options());
    for (std::int64_t t = 0; t < sc.steps; ++t) loop.step(opt, t);
    TrainerLoop::finish(opt, out.params, out.owners);
  } catch (const Error& e) {
    out.error = rpc::error_kind(e) + ": " + e.what();
    return out;
  }
  out.done = true;
  return out;
}

}  // namespace dopt::do_survive_test
