// A mismatch between ranks that are in different public calls names those
// calls first (ZeroRedundancyOptimizer::step(), PostLocalSGDOptimizer::step(),
// a direct ProcessGroup call), the internal collectives second. 3 and 5
// simulated ranks.
#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "call_names.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/sgd.hpp"

using namespace dopt;
using namespace dopt::optim;
using Catch::Contains;
using Catch::StartsWith;
using dopt::testing::on_ranks_but;

namespace {

/// One parameter of 20 elements with a gradient.
std::vector<Tensor> params() {
  Tensor p = Tensor::full({20}, 1.0);
  p.set_grad(Tensor::full({20}, 0.5));
  return {p};
}

/// Each rank's CollectiveMismatchError text ("" when its body did not raise
/// one): body(ctx) runs on every simulated rank.
std::vector<std::string> mismatches(int world, const std::function<void(RankContext&)>& body) {
  std::vector<std::string> out(static_cast<std::size_t>(world));
  SimulateOptions opts;
  opts.timeout = std::chrono::seconds(20);
  simulate(world, [&](RankContext& ctx) {
    try {
      body(ctx);
    } catch (const CollectiveMismatchError& e) {
      out[static_cast<std::size_t>(ctx.rank())] = e.what();
    }
  }, opts);
  return out;
}

/// mismatches() where every rank makes a ZeroRedundancyOptimizer over
/// params(); rank 1 runs rank1(ctx, params), the others step it.
std::vector<std::string> zero_step_but_rank_1(int world,
                                              const std::function<void(RankContext&, std::vector<Tensor>&)>& rank1) {
  return mismatches(world, [&](RankContext& ctx) {
    auto ps = params();
    ZeroRedundancyOptimizer z(ps, OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});
    if (ctx.rank() == 1) rank1(ctx, ps);
    else z.step();
  });
}

/// mismatches() where every rank but 1 runs make(ctx) (a constructor that
/// talks to the others) and rank 1 calls ProcessGroup::barrier() instead.
std::vector<std::string> construct_but_rank_1(int world, const std::function<void(RankContext&)>& make) {
  return mismatches(world, [&](RankContext& ctx) {
    if (ctx.rank() == 1) ctx.world().barrier();
    else make(ctx);
  });
}

}  // namespace

TEST_CASE("errors name the user's calls: ZeRO's step on all ranks but one, a direct all_reduce on that one",
          "[zero][call_label]") {
  const int n = GENERATE(3, 5);
  CAPTURE(n);
  auto e = zero_step_but_rank_1(n, [](RankContext& ctx, std::vector<Tensor>& ps) {
    ctx.world().all_reduce(ps[0].grad());  // this rank skipped z.step()
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK_THAT(e[static_cast<std::size_t>(r)],
               StartsWith(std::string(r == 1 ? "ProcessGroup::all_reduce()" : "ZeroRedundancyOptimizer::step()") +
                          " [rank " + std::to_string(r) + "]: ZeroRedundancyOptimizer::step() " + on_ranks_but(n, 1) +
                          "; ProcessGroup::all_reduce() on rank 1; internally: ") &&
                   Contains("but rank 1 called all_reduce(sum, float32, [20])"));
  }
}

TEST_CASE("errors name the user's calls: ZeRO's step on all ranks but one, PostLocalSGD's step on that one",
          "[zero][post_local_sgd][call_label]") {
  const int n = GENERATE(3, 5);
  CAPTURE(n);
  auto e = zero_step_but_rank_1(n, [](RankContext& ctx, std::vector<Tensor>& ps) {
    PostLocalSGDOptimizer local(std::make_unique<SGD>(ps, SGDOptions(0.1)),
                                std::make_unique<PeriodicModelAverager>(1, 0, ctx.world()));
    local.step();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK_THAT(e[static_cast<std::size_t>(r)],
               Contains("]: ZeroRedundancyOptimizer::step() " + on_ranks_but(n, 1) +
                        "; PostLocalSGDOptimizer::step() on rank 1; internally: collective mismatch"));
  }
}


TEST_CASE("errors name the user's calls: a constructor's collectives are named by the constructor",
          "[zero][checkpoint][call_label]") {
  const int n = GENERATE(3, 5);
  // The constructors that agree on something with the other ranks.
  const std::vector<std::pair<std::string, std::function<void(RankContext&)>>> ctors{
      {"ZeroRedundancyOptimizer::ZeroRedundancyOptimizer()",
       [](RankContext& ctx) { ZeroRedundancyOptimizer z(params(), OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world()}); }},
      {"Checkpointer::Checkpointer()",
       [](RankContext& ctx) { Checkpointer c(CheckpointerOptions{ctx.world(), (std::filesystem::temp_directory_path() / "dopt-ctor-label-test").string(), 1}); }},
      {"HierarchicalModelAverager::HierarchicalModelAverager()",
       [](RankContext& ctx) { HierarchicalModelAverager h({{2, 1}, {4, ctx.world_size()}}, 0, ctx.world()); }},
  };
  for (const auto& [name, make] : ctors) {
    CAPTURE(n, name);
    auto e = construct_but_rank_1(n, make);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK_THAT(e[static_cast<std::size_t>(r)],
                 Contains("]: " + name + " " + on_ranks_but(n, 1) +
                          "; ProcessGroup::barrier() on rank 1; internally: collective mismatch"));
    }
  }
}
