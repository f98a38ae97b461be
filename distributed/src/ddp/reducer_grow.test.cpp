// The Reducer over a grown group (docs/growing-back.md, "The Reducer":
// nothing of a Reducer outlives an iteration but its group, so every rank
// builds a new one over the grown group). 5 simulated ranks (deterministic)
// with survive: rank 3 is lost before step 2's gradients, the survivors
// recover in that step's finalize() and reduce over the four of them; before
// step join_at the members grow, a newcomer (rank 5) joins, and every rank
// builds a Reducer over the grown group with broadcast_parameters (the
// newcomer's parameters become group rank 0's). Each rank's averaged
// gradients of every step it was there, then its parameters, are compared
// bitwise with a reference written here: at step t, the mean of the
// gradients of the ranks there then, each divided by their count and summed
// in ascending rank order (allreduce_hook: divide, then an all_reduce in
// group-rank order).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "dopt/distributed/reducer.hpp"
#include "local_sgd/grow_test_support.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::grow_test;

namespace {

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300};
constexpr int kLost = 3, kNewcomer = 5;
constexpr std::int64_t kLostAt = 2, kSteps = 6;

/// Rank r's record in the reference: the averaged gradients of the steps it
/// was there, then the parameters (every rank's initial ones: nothing steps them).
std::vector<Params> reference(const Plan& plan) {
  std::vector<Params> out(kNewcomer + 1);
  for (std::int64_t t = 0; t < kSteps; ++t) {
    const auto ranks = plan.present(t);
    const auto n = static_cast<float>(ranks.size());
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      std::vector<float> avg(static_cast<std::size_t>(kSizes[i]));
      for (std::int64_t k = 0; k < kSizes[i]; ++k) {
        float acc = 0.0f;
        for (std::size_t j = 0; j < ranks.size(); ++j) {
          const float v = survive_reference::grad_elem(ranks[j], t, i, k) / n;
          acc = j == 0 ? v : acc + v;
        }
        avg[static_cast<std::size_t>(k)] = acc;
      }
      for (int r : ranks) out[static_cast<std::size_t>(r)].push_back(avg);
    }
  }
  for (int r = 0; r <= kNewcomer; ++r)
    if (r != kLost)
      for (auto& p : values_of(survive_reference::make_params(kSizes))) out[static_cast<std::size_t>(r)].push_back(p);
  return out;
}

ReducerOptions options(std::string& log, bool broadcast) {
  ReducerOptions o;
  o.first_bucket_cap_bytes = 2048;
  o.bucket_cap_bytes = 16384;
  o.broadcast_parameters = broadcast;
  o.survive = true;
  // r.step counts the iterations done, the recovered one included.
  o.on_membership_change = [&log](const ZeroRecovery& r) { log += "shrank after " + std::to_string(r.step) + ";"; };
  return o;
}

Params rank_run(RankContext& ctx, std::string& log, std::int64_t join_at) {
  const int me = ctx.rank();
  auto params = survive_reference::make_params(kSizes);
  std::unique_ptr<Reducer> reducer;
  std::int64_t t = 0;
  if (ctx.newcomer()) {
    for (auto& q : params) q.data<float>()[0] = -7.5f;  // overwritten by the Reducer's broadcast
    auto joined = join_patiently(ctx);
    reducer = std::make_unique<Reducer>(params, joined.group, options(log, true));
    t = join_at;
    log += "joined;";
  } else {
    reducer = std::make_unique<Reducer>(params, ctx.world(), options(log, false));
  }
  Params out;
  for (; t < kSteps; ++t) {
    if (t == join_at && !ctx.newcomer()) {
      ProcessGroup old = reducer->process_group();
      reducer = std::make_unique<Reducer>(params, old.grow().group, options(log, true));
      log += "grew at " + std::to_string(t) + ";";
    }
    if (me == kLost && t == kLostAt) throw Lost();
    set_rank_grads(params, me, t);
    for (const auto& p : params) reducer->mark_ready(p);
    reducer->finalize();
    for (const auto& p : params) out.push_back(p.grad().to_vector<float>());
  }
  for (auto& p : values_of(params)) out.push_back(p);
  return out;
}

}  // namespace

TEST_CASE("Reducer over a grown group: a rank lost at step 2, a newcomer later: the averaged gradients bitwise the "
          "reference",
          "[reducer][grow]") {
  const std::int64_t join_at = GENERATE(3, 4);
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("join at " << join_at << ", seed " << seed);
  const auto got = run_with_newcomer(
      kNewcomer, seed, [&](RankContext& ctx, std::string& log) { return rank_run(ctx, log, join_at); });
  CHECK(got[0].second == "shrank after 3;grew at " + std::to_string(join_at) + ";");  // the scenario ran
  CHECK(got[kNewcomer].second == "joined;");
  check_bitwise(got, reference(Plan{kLost, kLostAt, kNewcomer, join_at}), kLost);
}
