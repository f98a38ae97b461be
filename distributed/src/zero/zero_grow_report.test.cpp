// zero_catch_up reports a join to the members' on_membership_change
// (recovery.hpp, ZeroRecovery::joined): 3 simulated ranks (deterministic)
// take 2 steps, a newcomer joins, every rank builds a ZeRO over the grown
// group and catches up. The members' callbacks see the join; the
// newcomer's is not called.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "dopt/distributed/zero.hpp"
#include "local_sgd/grow_test_support.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33};
const OptimizerSpec kAdam{"Adam", {{"lr", 0.01}}};

/// "<group size> <joined> <new ranks> <lost> <step>;"
std::string describe(const ZeroRecovery& r) {
  auto list = [](const std::vector<int>& rs) {
    std::string out;
    for (int x : rs) out += (out.empty() ? "" : ",") + std::to_string(x);
    return "[" + out + "]";
  };
  return std::to_string(r.group.size()) + " " + list(r.joined) + " " + list(r.new_rank) + " " + list(r.lost) + " " +
         std::to_string(r.step) + (r.step_completed ? " completed" : "") + ";";
}

}  // namespace

TEST_CASE("zero_catch_up reports the join to the members' on_membership_change", "[zero][grow]") {
  const auto got = grow_test::run_with_newcomer(3, 11, [](RankContext& ctx, std::string& log) {
    auto params = survive_reference::make_params(kSizes);
    auto make = [&](const ProcessGroup& g) {
      ZeroOptions zo{g};
      zo.on_membership_change = [&log](const ZeroRecovery& r) { log += describe(r); };
      return std::make_unique<ZeroRedundancyOptimizer>(params, kAdam, zo);
    };
    if (ctx.newcomer()) {
      auto joined = grow_test::join_patiently(ctx);
      auto zero = make(joined.group);
      zero_catch_up(*zero, nullptr, joined);
      return grow_test::values_of(params);
    }
    ProcessGroup g = ctx.world();
    auto zero = make(g);
    for (std::int64_t t = 0; t < 2; ++t) {
      survive_reference::set_mean_grads(params, g, ctx.rank(), t);
      zero->step();
    }
    auto grown = g.grow();
    auto bigger = make(grown.group);
    zero_catch_up(*bigger, zero.get(), grown);
    return grow_test::values_of(params);
  });
  for (int r = 0; r < 3; ++r) CHECK(got[static_cast<std::size_t>(r)].second == "4 [3] [0,1,2] [] 2;");
  CHECK(got[3].second.empty());
  CHECK(got[3].first == got[0].first);  // the newcomer holds rank 0's parameters
}
