// PostLocalSGDOptimizer growing back (post_local_sgd_catch_up) between the
// ranks of a deterministic simulation: 5 ranks train with Adam and a
// PeriodicModelAverager (averages at steps 1, 3, 5, ...), surviving losses;
// rank 3 is lost before step 2's gradients, the survivors notice it at step
// 3's average, shrink and average over the four of them; a newcomer (rank 5)
// joins before step join_at and catches up from the lowest-ranked member.
// Every rank's final parameters are compared bitwise with a reference
// defined here, all ranks in one thread: each rank's own Adam on its own
// gradients; at each averaging step the ranks there then (ascending) set to
// sum_r (p_r / n) in gloo's ring order (ring_order_reference.hpp); the
// newcomer, at join_at, a copy of rank 0's parameters and Adam state.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "grow_test_support.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::grow_test;

namespace {

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300};
const OptimizerSpec kInner{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
constexpr std::int64_t kWarmup = 1, kPeriod = 2;
constexpr int kLost = 3, kNewcomer = 5;
constexpr std::int64_t kLostAt = 2, kSteps = 10;

bool averages(std::int64_t t) { return t >= kWarmup && (t - kWarmup) % kPeriod == 0; }

/// sum_r (p_r / n) over `ranks`, the ranks' parameters seen as one flat
/// float32 buffer (gloo's ring order), written into every one of them.
void ring_average(RefRanks& rs, const std::vector<int>& ranks) {
  std::int64_t total = 0;
  for (auto s : kSizes) total += s;
  const int n = static_cast<int>(ranks.size());
  std::int64_t base = 0;
  for (std::size_t i = 0; i < kSizes.size(); base += kSizes[i], ++i) {
    Tensor avg = Tensor::zeros({kSizes[i]});
    for (std::int64_t k = 0; k < kSizes[i]; ++k)
      avg.data<float>()[k] = ring_sum(base + k, total, n, [&](int g) {
        return rs.params(ranks[static_cast<std::size_t>(g)])[i].data<float>()[k] / static_cast<float>(n);
      });
    for (int r : ranks) rs.params(r)[i].copy_(avg);
  }
}

std::vector<Params> reference(const Plan& plan) {
  RefRanks rs(plan, kSizes, kInner);
  for (std::int64_t t = 0; t < kSteps; ++t) {
    const auto ranks = rs.step(t);
    if (averages(t)) ring_average(rs, ranks);
  }
  return rs.values();
}

std::unique_ptr<PostLocalSGDOptimizer> make_opt(const std::vector<Tensor>& params, const ProcessGroup& g) {
  auto opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                     std::make_unique<PeriodicModelAverager>(kPeriod, kWarmup, g));
  opt->enable_survive();
  return opt;
}

}  // namespace

TEST_CASE("post_local_sgd_catch_up: a rank lost at step 2, a newcomer later: every rank bitwise the reference",
          "[post_local_sgd][grow]") {
  const std::int64_t join_at = GENERATE(4, 5);  // between averages, and at one
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("join at " << join_at << ", seed " << seed);
  const Plan plan{kLost, kLostAt, kNewcomer, join_at};
  const auto got = run_with_newcomer(kNewcomer, seed, [&](RankContext& ctx, std::string& log) {
    return plsgd_rank_run(ctx, log, plan, kSteps, kSizes, make_opt, {});
  });
  CHECK(got[0].second == "shrank at 3;grew at " + std::to_string(join_at) + ";");  // the scenario ran
  CHECK(got[kNewcomer].second == "joined at " + std::to_string(join_at) + ";");
  check_bitwise(got, reference(plan), kLost);
}

namespace {

std::string ranks_of(const std::vector<int>& rs) {
  std::string out;
  for (int r : rs) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

}  // namespace

TEST_CASE("post_local_sgd_catch_up reports the join to the members' on_membership_change", "[post_local_sgd][grow]") {
  const auto got = run_with_newcomer(3, 7, [](RankContext& ctx, std::string& log) {
    auto params = survive_reference::make_params(kSizes);
    GrowResult joined;
    if (ctx.newcomer()) joined = join_patiently(ctx);
    auto opt = make_opt(params, ctx.newcomer() ? joined.group : ctx.world());
    opt->enable_survive([&log](const ZeroRecovery& r) {
      log += "size " + std::to_string(r.group.size()) + " joined " + ranks_of(r.joined) + " new ranks " +
             ranks_of(r.new_rank) + " lost " + ranks_of(r.lost) + " step " + std::to_string(r.step) +
             (r.step_completed ? " completed" : "") + ";";
    });
    if (ctx.newcomer()) {
      post_local_sgd_catch_up(*opt, joined);  // not reported on the newcomer
      return values_of(params);
    }
    for (std::int64_t t = 0; t < 2; ++t) {
      set_rank_grads(params, ctx.rank(), t);
      opt->step();
    }
    ProcessGroup old = ctx.world();
    post_local_sgd_catch_up(*opt, old.grow());
    return values_of(params);
  });
  for (int r = 0; r < 3; ++r) CHECK(got[static_cast<std::size_t>(r)].second == "size 4 joined 3 new ranks 0,1,2 lost  step 2;");
  CHECK(got[3].second.empty());
  CHECK(got[3].first == got[0].first);  // the newcomer holds rank 0's parameters
}
