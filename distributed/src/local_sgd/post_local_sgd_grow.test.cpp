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
constexpr int kLost = 3;
constexpr std::int64_t kLostAt = 2;
constexpr int kNewcomer = 5;
constexpr std::int64_t kSteps = 10;

bool averages(std::int64_t t) { return t >= kWarmup && (t - kWarmup) % kPeriod == 0; }

/// The ranks that step t (and, on averaging steps, its average) holds.
std::vector<int> present(std::int64_t t, std::int64_t join_at) {
  std::vector<int> out;
  for (int r = 0; r <= kNewcomer; ++r)
    if ((r != kLost || t < kLostAt) && (r != kNewcomer || t >= join_at)) out.push_back(r);
  return out;
}

/// One rank of the reference: its parameters and its own optimizer.
struct RefRank {
  std::vector<Tensor> params;
  std::unique_ptr<Optimizer> opt;
};

/// sum_r (p_r / n) over `ranks`, the ranks' parameters seen as one flat
/// float32 buffer (gloo's ring order), written into every one of them.
void ring_average(std::vector<RefRank>& rs, const std::vector<int>& ranks) {
  std::int64_t total = 0;
  for (auto s : kSizes) total += s;
  const int n = static_cast<int>(ranks.size());
  std::int64_t base = 0;
  for (std::size_t i = 0; i < kSizes.size(); base += kSizes[i], ++i) {
    Tensor avg = Tensor::zeros({kSizes[i]});
    for (std::int64_t k = 0; k < kSizes[i]; ++k)
      avg.data<float>()[k] = ring_sum(base + k, total, n, [&](int g) {
        return rs[static_cast<std::size_t>(ranks[static_cast<std::size_t>(g)])].params[i].data<float>()[k] /
               static_cast<float>(n);
      });
    for (int r : ranks) rs[static_cast<std::size_t>(r)].params[i].copy_(avg);
  }
}

std::vector<Params> reference(std::int64_t join_at) {
  std::vector<RefRank> rs(kNewcomer + 1);
  auto make = [](std::vector<Tensor> ps) {
    RefRank r{std::move(ps), nullptr};
    r.opt = make_optimizer(kInner, {OptimizerParamGroup(r.params)});
    return r;
  };
  for (int r = 0; r < kNewcomer; ++r) rs[static_cast<std::size_t>(r)] = make(survive_reference::make_params(kSizes));
  for (std::int64_t t = 0; t < kSteps; ++t) {
    if (t == join_at) {  // a copy of rank 0, the lowest-ranked member
      std::vector<Tensor> ps;
      for (const auto& p : rs[0].params) ps.push_back(p.clone());
      rs[kNewcomer] = make(ps);
      rs[kNewcomer].opt->load_state_dict(rs[0].opt->state_dict());
    }
    const auto ranks = present(t, join_at);
    for (int r : ranks) {
      set_rank_grads(rs[static_cast<std::size_t>(r)].params, r, t);
      rs[static_cast<std::size_t>(r)].opt->step();
    }
    if (averages(t)) ring_average(rs, ranks);
  }
  std::vector<Params> out;
  for (const auto& r : rs) out.push_back(values_of(r.params));
  return out;
}

std::unique_ptr<PostLocalSGDOptimizer> make_opt(const std::vector<Tensor>& params, const ProcessGroup& g) {
  auto opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                     std::make_unique<PeriodicModelAverager>(kPeriod, kWarmup, g));
  opt->enable_survive();
  return opt;
}

/// One rank of the run (the newcomer too): its final parameters.
Params rank_run(RankContext& ctx, std::string& log, std::int64_t join_at) {
  const int me = ctx.rank();
  auto params = survive_reference::make_params(kSizes);
  std::unique_ptr<PostLocalSGDOptimizer> opt;
  if (ctx.newcomer()) {
    for (auto& q : params) q.data<float>()[0] = -7.5f;  // overwritten by the catch-up
    auto joined = join_patiently(ctx);
    opt = make_opt(params, joined.group);
    post_local_sgd_catch_up(*opt, joined);
    log += "joined at " + std::to_string(opt->steps_taken()) + ";";
  } else {
    opt = make_opt(params, ctx.world());
  }
  while (opt->steps_taken() < kSteps) {
    const std::int64_t t = opt->steps_taken();
    if (t == join_at && !ctx.newcomer()) {
      ProcessGroup old = opt->averager().process_group();
      post_local_sgd_catch_up(*opt, old.grow());
      log += "grew at " + std::to_string(t) + ";";
    }
    if (me == kLost && t == kLostAt) throw Lost();
    set_rank_grads(params, me, t);
    try {
      opt->step();
    } catch (const MembershipChangedError&) {
      log += "shrank at " + std::to_string(t) + ";";
    }
  }
  return values_of(params);
}

}  // namespace

TEST_CASE("post_local_sgd_catch_up: a rank lost at step 2, a newcomer later: every rank bitwise the reference",
          "[post_local_sgd][grow]") {
  const std::int64_t join_at = GENERATE(4, 5);  // between averages, and at one
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("join at " << join_at << ", seed " << seed);
  const auto got = run_with_newcomer(
      kNewcomer, seed, [&](RankContext& ctx, std::string& log) { return rank_run(ctx, log, join_at); });
  CHECK(got[0].second == "shrank at 3;grew at " + std::to_string(join_at) + ";");  // the scenario ran
  CHECK(got[kNewcomer].second == "joined at " + std::to_string(join_at) + ";");
  check_bitwise(got, reference(join_at), kLost);
}
