// PostLocalSGDOptimizer::step_async over simulated ranks (3 and 5): bitwise
// step()'s parameters, state and averager counter with PeriodicModelAverager
// and DiLoCoAverager (float32 and a quantized wire, a delayed fragment), user
// work between the call and the wait; the calls that wait for a step in
// flight; a lost peer's error carried by the future, then reported by the
// next call (PeriodicModelAverager) or left with the future (DiLoCo: the
// fragment back at its anchors). Rank functions record what they found; the
// test thread asserts after simulate() returned.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/sgd.hpp"
#include "lost_rank.hpp"
#include "rank_checks.hpp"
#include "reference_data.hpp"
#include "sim_timeout.hpp"
#include "state_bits.hpp"
#include "thrown.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

std::vector<Tensor> plsgd_params() { return testing::uneven_params(3, 4, 7, 60); }

/// Rank r's gradients of step t (they differ between the ranks: local SGD).
void set_rank_grads(const std::vector<Tensor>& ps, int r, int t) {
  for (std::size_t k = 0; k < ps.size(); ++k)
    ps[k].set_grad(testing::tensor_of(testing::values<float>(
        static_cast<std::size_t>(ps[k].numel()), 5000 + 97 * static_cast<std::uint64_t>(r) + 13 * t + k)));
}

using MakeAverager = std::function<std::unique_ptr<ModelAverager>(const std::vector<Tensor>&, ProcessGroup)>;

/// Runs step() on one copy and step_async() on another for `steps` steps at
/// `world` ranks, user work between the call and its wait; records every
/// bitwise difference of parameters, state dicts and counters.
void check_async_is_blocking(int world, int steps, const MakeAverager& make, testing::RankLog& found) {
  simulate(world, [&](RankContext& ctx) {
    auto a = plsgd_params();
    auto b = plsgd_params();
    PostLocalSGDOptimizer blocking(std::make_unique<SGD>(a, SGDOptions(0.05).momentum(0.9)), make(a, ctx.world()));
    PostLocalSGDOptimizer async(std::make_unique<SGD>(b, SGDOptions(0.05).momentum(0.9)), make(b, ctx.world()));
    const std::string me = "rank " + std::to_string(ctx.rank());
    for (int t = 0; t < steps; ++t) {
      set_rank_grads(a, ctx.rank(), t);
      set_rank_grads(b, ctx.rank(), t);
      blocking.step();
      Future<void> done = async.step_async();
      async.zero_grad(/*set_to_none=*/t % 2 == 1);  // user work meanwhile: gradients only
      set_rank_grads(b, ctx.rank(), t + 1000);
      done.get();
      for (std::size_t k = 0; k < a.size(); ++k)
        if (!testing::same_bits(a[k], b[k]))
          found.fail(me + " step " + std::to_string(t) + " parameter " + std::to_string(k) + " differs");
    }
    if (blocking.averager().step() != async.averager().step()) found.fail(me + ": the averagers' counters differ");
    const std::string d = testing::state_dict_difference(blocking.state_dict(), async.state_dict());
    if (!d.empty()) found.fail(me + ": " + d);
  });
}

DiLoCoOptions diloco_options(WireFormat wire, std::int64_t delay) {
  DiLoCoOptions o;
  o.sync_every = 4;
  o.fragments = {{0, 2}, {1}};
  o.fragment_sync_delay = delay;
  o.wire_format = wire;
  o.error_feedback = wire != WireFormat::float32;
  o.row_size = 8;
  return o;
}

}  // namespace

TEST_CASE("PostLocalSGDOptimizer::step_async().get() is step() bit for bit with PeriodicModelAverager (3, 5 ranks)",
          "[post_local_sgd][plsgd_async]") {
  for (int world : {3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      testing::RankLog found;
      check_async_is_blocking(world, 9, [](const std::vector<Tensor>&, ProcessGroup g) {
        return std::make_unique<PeriodicModelAverager>(3, 2, std::move(g));
      }, found);
      found.report();
    }
  }
}

TEST_CASE("PostLocalSGDOptimizer::step_async().get() is step() bit for bit with DiLoCoAverager: float32, int8 "
          "with error feedback, a delayed fragment (3, 5 ranks)",
          // Not [post_local_sgd]: out of the sim swarm, as every [diloco] test is (the
          // quantized wire's all_reduce runs on a thread of its own, outside the scheduler).
          "[plsgd_async][diloco]") {
  for (int world : {3, 5}) {
    for (WireFormat wire : {WireFormat::float32, WireFormat::int8}) {
      for (std::int64_t delay : {0, 1}) {
        DYNAMIC_SECTION("world " << world << " wire " << static_cast<int>(wire) << " delay " << delay) {
          testing::RankLog found;
          check_async_is_blocking(world, 10, [&](const std::vector<Tensor>& ps, ProcessGroup g) {
            return std::make_unique<DiLoCoAverager>(ps, diloco_options(wire, delay), std::move(g));
          }, found);
          found.report();
        }
      }
    }
  }
}

TEST_CASE("PostLocalSGDOptimizer::step_async: step(), skip_step() and state_dict() wait for the step in flight "
          "(3 ranks)",
          "[post_local_sgd][plsgd_async]") {
  testing::RankLog found;
  simulate(3, [&](RankContext& ctx) {
    auto ps = plsgd_params();
    PostLocalSGDOptimizer opt(std::make_unique<SGD>(ps, SGDOptions(0.05)),
                              std::make_unique<PeriodicModelAverager>(2, 0, ctx.world()));
    set_rank_grads(ps, ctx.rank(), 0);
    Future<void> first = opt.step_async();  // step 0 averages
    opt.skip_step();
    if (!first.is_ready()) found.fail("skip_step() returned before the average in flight completed");
    set_rank_grads(ps, ctx.rank(), 1);
    Future<void> second = opt.step_async();  // step 2 averages
    (void)opt.state_dict();
    if (!second.is_ready()) found.fail("state_dict() returned before the average in flight completed");
    set_rank_grads(ps, ctx.rank(), 2);
    Future<void> third = opt.step_async();  // step 3 does not average: ready at once
    if (!third.is_ready()) found.fail("a step that does not average was not ready at once");
    opt.step();
    if (opt.averager().step() != 5 || opt.steps_taken() != 4) found.fail("the counters are not 5 and 4");
  });
  found.report();
}

TEST_CASE("PostLocalSGDOptimizer::step_async: a lost peer's error is carried by the future, the next call reports "
          "it, except with DiLoCo, whose fragment is back at its anchors (3 ranks)",
          "[post_local_sgd][plsgd_async][diloco]") {
  for (bool diloco : {false, true}) {
    DYNAMIC_SECTION((diloco ? "DiLoCoAverager" : "PeriodicModelAverager")) {
      testing::RankLog found;
      testing::simulate_losing(
          3,
          [&](RankContext& ctx) {
            auto ps = plsgd_params();
            std::unique_ptr<ModelAverager> avg;
            if (diloco) avg = std::make_unique<DiLoCoAverager>(ps, diloco_options(WireFormat::float32, 0), ctx.world());
            else avg = std::make_unique<PeriodicModelAverager>(2, 1, ctx.world());
            PostLocalSGDOptimizer opt(std::make_unique<SGD>(ps, SGDOptions(0.05)), std::move(avg));
            set_rank_grads(ps, ctx.rank(), 0);
            opt.step();  // no average at step 0 with either averager
            if (ctx.rank() == 2) throw testing::Killed();
            set_rank_grads(ps, ctx.rank(), 1);
            // Step 1 averages (Periodic), syncs fragment 0 (DiLoCo).
            found.check(testing::carries_peer_lost(opt.step_async()), "the future does not carry a PeerLostError");
            if (diloco) {
              auto& d = dynamic_cast<DiLoCoAverager&>(opt.averager());
              for (auto i : d.fragments()[0])
                if (!testing::same_bits(ps[static_cast<std::size_t>(i)], d.anchors()[static_cast<std::size_t>(i)]))
                  found.fail("DiLoCo: parameter " + std::to_string(i) + " is not back at its anchor");
              (void)opt.state_dict();  // not StateError: nothing differs between the ranks
              return;
            }
            const std::string what = testing::what_thrown<StateError>([&] { opt.step(); });
            if (what.find("PostLocalSGDOptimizer.step") == std::string::npos ||
                what.find("step_async") == std::string::npos)
              found.fail("step() after the failed step_async: not a StateError naming it and step_async: '" + what +
                         "'");
          },
          testing::with_timeout(std::chrono::seconds(30)));
      found.report();
    }
  }
}
