// ZeroRedundancyOptimizer::step_async over simulated ranks (3 and 5: uneven
// shards): bitwise step()'s parameters, state and step count over several
// steps with user work between the call and the wait; the calls that wait
// for a step in flight; a lost peer's error carried by the future and then
// reported by the next call that waits. Rank functions record what they
// found; the test thread asserts after simulate() returned.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/sgd.hpp"
#include "lost_rank.hpp"
#include "rank_checks.hpp"
#include "reference_data.hpp"
#include "sim_timeout.hpp"
#include "state_bits.hpp"
#include "thrown.hpp"

using namespace dopt;
using namespace dopt::optim;
using dopt::testing::same_bits;
using dopt::testing::state_dict_difference;

namespace {

/// Seven parameters of uneven sizes (the shards differ at 3 and 5 ranks).
std::vector<Tensor> async_params() { return testing::uneven_params(7, 3, 5, 40); }

/// The gradients of step t (the same on every rank: ZeRO takes averaged ones).
void set_step_grads(const std::vector<Tensor>& ps, int t) {
  for (std::size_t k = 0; k < ps.size(); ++k)
    ps[k].set_grad(testing::tensor_of(
        testing::values<float>(static_cast<std::size_t>(ps[k].numel()), 900 + 31 * static_cast<std::uint64_t>(t) + k)));
}

/// Two optimizers over two copies of the same parameters: `blocking` steps
/// with step(), `async` with step_async().
struct Twins {
  std::vector<Tensor> a = async_params();
  std::vector<Tensor> b = async_params();
  ZeroRedundancyOptimizer blocking;
  ZeroRedundancyOptimizer async;
  Twins(const OptimizerOptions& o, const ZeroOptions& zo) : blocking(a, o, zo), async(b, o, zo) {}
  /// Step t's gradients on both; blocking steps.
  void blocking_step(int t) {
    set_step_grads(a, t);
    set_step_grads(b, t);
    blocking.step();
  }
  /// "" when the parameters are the same bits, else the first that differs.
  std::string param_difference() const {
    for (std::size_t k = 0; k < a.size(); ++k)
      if (!same_bits(a[k], b[k])) return "parameter " + std::to_string(k) + " differs";
    return "";
  }
};

}  // namespace

TEST_CASE("ZeroRedundancyOptimizer::step_async().get() is step() bit for bit, user work in between (3, 5 ranks)",
          "[zero][zero_async]") {
  for (int world : {3, 5}) {
    for (bool bucket_view : {false, true}) {
      DYNAMIC_SECTION("world " << world << " bucket_view " << bucket_view) {
        testing::RankLog found;
        simulate(world, [&](RankContext& ctx) {
          ZeroOptions zo{ctx.world()};
          zo.parameters_as_bucket_view = bucket_view;
          Twins z(AdamOptions(0.01), zo);
          const std::string me = "rank " + std::to_string(ctx.rank()) + ": ";
          for (int t = 0; t < 6; ++t) {
            z.blocking_step(t);
            Future<void> done = z.async.step_async();
            // User work while the broadcasts are in flight: gradients only.
            z.async.zero_grad(/*set_to_none=*/t % 2 == 0);
            set_step_grads(z.b, t + 100);
            done.get();
            const std::string d = z.param_difference();
            if (!d.empty()) found.fail(me + "step " + std::to_string(t) + ": " + d);
          }
          if (z.blocking.step_count() != 6 || z.async.step_count() != 6) found.fail(me + "step_count is not 6");
          const std::string d = state_dict_difference(z.blocking.shard_state_dict(), z.async.shard_state_dict());
          if (!d.empty()) found.fail(me + d);
        });
        found.report();
      }
    }
  }
}

TEST_CASE("ZeroRedundancyOptimizer::step_async: the next step(), shard_state_dict() and consolidation wait for it "
          "(3, 5 ranks)",
          "[zero][zero_async]") {
  for (int world : {3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      testing::RankLog found;
      simulate(world, [&](RankContext& ctx) {
        Twins z(SGDOptions(0.1).momentum(0.9), ZeroOptions{ctx.world()});
        const std::string me = "rank " + std::to_string(ctx.rank()) + ": ";
        // step_async, then each call that must wait for it, without a wait of ours.
        const std::vector<std::pair<const char*, std::function<void()>>> calls = {
            {"step()", [&] { z.async.step(); }},
            {"shard_state_dict()",
             [&] {
               const std::string d = state_dict_difference(z.blocking.shard_state_dict(), z.async.shard_state_dict());
               if (!d.empty()) found.fail(me + d);
             }},
            {"consolidate_state_dict()", [&] { z.async.consolidate_state_dict(0); }},
        };
        int t = 0;
        for (const auto& [name, call] : calls) {
          z.blocking_step(t++);
          Future<void> done = z.async.step_async();
          if (std::string(name) == "step()") z.blocking_step(t++);  // the step() below takes these gradients
          call();
          if (!done.is_ready()) found.fail(me + name + " returned before the step in flight completed");
        }
        const std::string d = z.param_difference();
        if (!d.empty()) found.fail(me + d);
      });
      found.report();
    }
  }
}

TEST_CASE("ZeroRedundancyOptimizer::step_async with redundancy completes before it returns, bit for bit step() (3 ranks)",
          "[zero][zero_async]") {
  testing::RankLog found;
  simulate(3, [&](RankContext& ctx) {
    ZeroOptions zo{ctx.world()};
    zo.redundancy = 1;
    Twins z(AdamOptions(0.01), zo);
    for (int t = 0; t < 3; ++t) {
      z.blocking_step(t);
      if (!z.async.step_async().is_ready()) found.fail("the future of a step with redundancy was not ready");
    }
    const std::string d = z.param_difference();
    if (!d.empty()) found.fail(d);
  });
  found.report();
}

TEST_CASE("ZeroRedundancyOptimizer::step_async: a lost peer's error is carried by the future, then every call that "
          "waits reports it (3 ranks)",
          "[zero][zero_async]") {
  testing::RankLog found;
  testing::simulate_losing(
      3,
      [&](RankContext& ctx) {
        auto ps = async_params();
        ZeroRedundancyOptimizer zero(ps, SGDOptions(0.1), ZeroOptions{ctx.world()});
        set_step_grads(ps, 0);
        zero.step();
        if (ctx.rank() == 2) throw testing::Killed();  // before its second step: its shard never comes
        set_step_grads(ps, 1);
        found.check(testing::carries_peer_lost(zero.step_async()), "the future does not carry a PeerLostError");
        // Reported by every later call that waits, naming it.
        const std::vector<std::pair<std::string, std::function<void()>>> calls = {
            {"ZeroRedundancyOptimizer.step", [&] { zero.step(); }},
            {"ZeroRedundancyOptimizer.shard_state_dict", [&] { (void)zero.shard_state_dict(); }},
        };
        for (const auto& [op, call] : calls) {
          const std::string what = testing::what_thrown<StateError>(call);
          if (what.find(op) == std::string::npos || what.find("step_async") == std::string::npos)
            found.fail("not a StateError naming " + op + " and step_async: '" + what + "'");
        }
      },
      testing::with_timeout(std::chrono::seconds(30)));
  found.report();
}
