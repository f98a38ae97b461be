#pragma once
// Test support (not installed): a DistributedOptimizer with redundancy loses
// owners, then standby workers become owners again through
// distributed_optimizer_catch_up. Shared by
// distributed/src/rpc_optim/distributed_optimizer_grow.test.cpp (simulated
// workers) and tests/rpc_peer.cpp ("grow", processes).
//
// Workers: rank 0 is the trainer, ranks 1..n-1 own two parameters each (the
// parameters and gradients of distributed_optimizer_survive_scenarios.hpp),
// ranks n.. are standby workers (no parameters). The trainer sets the
// learning rate once (step 1, so the slot's holder must send it with the
// state), loses owners at the given steps and points (as the survive
// scenarios do), calls distributed_optimizer_catch_up(opt, newcomers) before
// the deposits of step `join_at`, and may lose more owners afterwards (the
// buddies rebuilt by the catch-up take their slots).
//
// The reference run: one FunctionalOptimizer of the same spec over copies of
// the initial parameters, stepped with the gradients of every step and the
// same learning-rate change. The trainer's gradients are the only ones of a
// step, whoever holds a parameter (the owners, the shrunken set during the
// gap, the grown set with the newcomer holding the state it received): a loss
// or a join changes where a parameter and its optimizer state live, never what
// is applied to them, so the final parameters equal the reference bit for bit
// only when the newcomer got the exact state (Adam's moments and step, SGD's
// momentum buffers, the learning rate).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "distributed_optimizer_survive_scenarios.hpp"
#include "rpc/testing.hpp"

namespace dopt::do_grow_test {

using namespace dopt::optim;
using do_survive_test::Loss;

struct Plan {
  int n = 3;
  int standby = 1;
  OptimizerSpec spec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.001}}};
  int redundancy = 1;
  /// Points: "before", "begin", "mirrored", "after" (survive scenarios),
  /// "hand_over": a slot's holder dies as it starts sending the slot to its
  /// newcomer (step: the steps applied, join_at), and "adopting": the holder
  /// dies while its newcomer builds the slot's owner (the newcomer has it
  /// killed and waits until it sees the loss, then goes on). The catch-up
  /// fails with nothing changed and is called again after the next step.
  std::vector<Loss> losses;
  std::int64_t join_at = 4;
  std::vector<int> newcomers;
  std::int64_t steps = 7;
  bool callback = false;
  /// A newcomer dies as it adopts its slot (the catch-up fails, nothing
  /// changes); the trainer then calls the catch-up again with the next
  /// standby worker (the rank after this one).
  int dies_adopting = -1;
  /// This owner refuses (StateError, once) the buddies the catch-up sets
  /// (dopt.optim.set_mirrors): the catch-up fails and is called again after
  /// the next step.
  int refuses_mirrors = -1;
};

inline OptimizerSpec sgd_momentum() { return OptimizerSpec{"SGD", {{"lr", 0.05}, {"momentum", 0.9}}}; }
inline constexpr double kLrAt1 = 0.005;

struct Result {
  bool done = false;
  std::vector<std::vector<unsigned char>> params;
  std::vector<int> owners;         // at the end
  std::vector<int> owners_joined;  // right after the catch-up
  std::vector<double> lrs_joined;  // every owner's lr right after the catch-up
  std::vector<int> owners_failed;  // right after a failed catch-up
  std::string log;
  std::string error;
};

/// The survive scenario p's steps run (do_survive_test::TrainerLoop).
inline do_survive_test::Scenario survive_of(const Plan& p) {
  do_survive_test::Scenario sc;
  sc.n = p.n;
  sc.redundancy = p.redundancy;
  sc.losses = p.losses;
  sc.steps = p.steps;
  sc.callback = p.callback;
  return sc;
}

inline std::vector<std::vector<unsigned char>> reference(const Plan& p) {
  const auto sc = survive_of(p);
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < do_survive_test::num_params(sc); ++i) ps.push_back(do_survive_test::initial_param(i));
  auto opt = make_functional(p.spec, ps);
  for (std::int64_t t = 0; t < p.steps; ++t) {
    if (t == 1) opt->set_lr(kLrAt1);
    opt->step(do_survive_test::grads_of(sc, t));
  }
  std::vector<std::vector<unsigned char>> out;
  for (const auto& x : ps) out.push_back(do_survive_test::bytes_of(x));
  return out;
}

/// Registers the workers' functions and installs the owners' probe for p's
/// "begin", "mirrored" and adoption losses. Call in every process before the run.
inline void install(const Plan& p) {
  do_survive_test::Scenario sc;
  sc.losses = p.losses;
  do_survive_test::install(sc);
  rpc::register_function("dog.owned",
                         [](rpc::Agent& a) { return static_cast<std::int64_t>(rpc::testing::num_owned(a)); });
  const auto losses = p.losses;
  const int adopting = p.dies_adopting;
  const int refusing = p.refuses_mirrors;
  auto refused = std::make_shared<std::atomic<bool>>(false);
  optim::detail::set_owner_probe([losses, adopting, refusing, refused](rpc::Agent& a, const char* point, long step) {
    const std::string at(point);
    if (at == "adopt" && a.rank() == adopting) {
      do_survive_test::die_fn()(a);
      return true;
    }
    if (at == "set_mirrors" && a.rank() == refusing) return !refused->exchange(true);
    for (const auto& l : losses)
      if (at == "adopt" && l.point == "adopting" && l.step == step) {
        (void)a.rpc_async(l.victim, "dos.die");
        if (!a.wait_until_lost(l.victim, std::chrono::seconds(20)))
          throw TimeoutError("test", "the slot's holder did not die");
      }
    for (const auto& l : losses)
      if (l.victim == a.rank() && l.step == step && l.point == at) {
        do_survive_test::die_fn()(a);
        return true;
      }
    return false;
  });
}

using do_survive_test::describe;

/// The trainer (rank 0).
inline Result trainer(rpc::Agent& a, const Plan& p) {
  Result out;
  do_survive_test::TrainerLoop loop(a, survive_of(p), out.log);
  try {
    DistributedOptimizer opt(a, p.spec, loop.make_params(), loop.options());
    std::int64_t join_at = p.join_at;
    bool handing_lost = false;
    for (const auto& l : p.losses) handing_lost = handing_lost || l.point == "hand_over" || l.point == "adopting";
    for (std::int64_t t = 0; t < p.steps; ++t) {
      if (t == 1) opt.set_lr(kLrAt1);
      if (t == join_at) {
        std::vector<rpc::To> newcomers(p.newcomers.begin(), p.newcomers.end());
        OwnerRecovery r;
        bool joined = true;
        try {
          r = distributed_optimizer_catch_up(opt, newcomers);
        } catch (const Error& e) {
          const bool refused = p.refuses_mirrors >= 0 && rpc::error_kind(e) == "StateError";
          if (!refused && (rpc::error_kind(e) != "PeerLostError" || (p.dies_adopting < 0 && !handing_lost))) throw;
          out.log += "catch_up failed: " + rpc::error_kind(e) + ": " + e.what() + ";";
          for (const auto& w : opt.owners()) out.owners_failed.push_back(w.rank);
          for (int n : p.newcomers) {  // what the standby worker still holds (nothing: the slot did not move)
            std::int64_t owned = -1;
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
            while (!a.wait_until_lost(n, std::chrono::milliseconds(0)) &&
                   (owned = a.rpc_sync<std::int64_t>(n, "dog.owned")) != 0 && std::chrono::steady_clock::now() < until)
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
            out.log += "standby " + std::to_string(n) + " owns " + std::to_string(owned) + ";";
          }
          if (p.dies_adopting >= 0) {  // again at once, with the next standby worker
            for (auto& x : newcomers)
              if (x.rank == p.dies_adopting) x = rpc::To(p.dies_adopting + 1);
            r = distributed_optimizer_catch_up(opt, newcomers);
          } else {  // again after the next step, which recovers the lost holder
            joined = false;
            join_at = t + 1;
          }
        }
        if (joined) {
          out.log += "returned " + describe(r);
          for (const auto& w : opt.owners()) out.owners_joined.push_back(w.rank);
          out.lrs_joined = opt.lrs();
        }
      }
      loop.step(opt, t);
    }
    do_survive_test::TrainerLoop::finish(opt, out.params, out.owners);
  } catch (const Error& e) {
    out.error = rpc::error_kind(e) + ": " + e.what();
    return out;
  }
  out.done = true;
  return out;
}

}  // namespace dopt::do_grow_test
