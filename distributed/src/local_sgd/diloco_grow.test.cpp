// Streaming DiLoCo growing back (post_local_sgd_catch_up with a
// DiLoCoAverager) between the ranks of a deterministic simulation: 5 ranks,
// inner SGD with momentum, 2 fragments, sync_every 4 (H = 2), delay 1: at
// step t, fragment (t / 2) % 2 is prepared (its average started) when t is
// even and synced when t is odd. Rank 3 is lost before step 2's gradients:
// step 2's average of fragment 1 fails, so step 3's sync puts fragment 1
// back at its anchors on the survivors, which then go on over the shrunk
// group with the same state (docs/diloco.md: state_dict, a new averager,
// load_state_dict). A newcomer (rank 5) joins before step join_at: at 4 no
// fragment is in flight, at 5 fragment 0 is (prepared at step 4 by the four
// survivors; the catch-up completes it and the newcomer receives it).
// Every rank's final parameters are compared bitwise with the reference
// (grow_reference.hpp, diloco_reference), all ranks in one thread: each
// rank's inner SGD on its own gradients; at a prepare, the deltas anchor - p_r of the fragment of the
// ranks there then (ascending) summed in gloo's ring order over the
// fragment's flat float32 buffer and divided by their count; at a sync, the
// fragment's outer SGD steps the anchors with that average and every rank
// there takes the anchors (alpha 0); the newcomer, at join_at, a copy of
// rank 0's parameters and inner state.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "grow_test_support.hpp"

using namespace dopt;
using namespace dopt::optim;
using namespace dopt::grow_test;

namespace {

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300};
const std::vector<std::vector<std::int64_t>> kFragments = {{0, 2, 4}, {1, 3, 5}};
const OptimizerSpec kInner{"SGD", {{"lr", 0.05}, {"momentum", 0.9}}};
const OptimizerSpec kOuter{"SGD", {{"lr", 0.7}, {"momentum", 0.9}, {"nesterov", true}}};
constexpr std::int64_t kH = 2, kDelay = 1;
constexpr int kLost = 3, kNewcomer = 5;
constexpr std::int64_t kLostAt = 2;  // a prepare: its average fails, and so the sync after it
constexpr std::int64_t kSteps = 10;

std::unique_ptr<PostLocalSGDOptimizer> make_opt(const std::vector<Tensor>& params, const ProcessGroup& g) {
  DiLoCoOptions o;
  o.sync_every = kH * static_cast<std::int64_t>(kFragments.size());
  o.fragments = kFragments;
  o.fragment_sync_delay = kDelay;
  o.outer_optimizer = kOuter;
  return std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                 std::make_unique<DiLoCoAverager>(params, o, g));
}

/// The failed fragment is back at its anchors: a survivor goes on with the
/// same state over the shrunk group (docs/diloco.md).
void rebuild(std::unique_ptr<PostLocalSGDOptimizer>& opt) {
  const StateDict sd = opt->state_dict();
  ProcessGroup old = opt->averager().process_group();
  std::vector<Tensor> params = opt->param_groups().at(0).params;
  opt = make_opt(params, old.shrink().group);
  opt->load_state_dict(sd);
}

}  // namespace

TEST_CASE("DiLoCo catch-up: a rank lost at step 2, a newcomer later, with and without a fragment in flight: "
          "every rank bitwise the reference",
          "[diloco][grow]") {
  const std::int64_t join_at = GENERATE(4, 5);  // nothing in flight, fragment 0 in flight
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("join at " << join_at << ", seed " << seed);
  const Plan plan{kLost, kLostAt, kNewcomer, join_at};
  const auto got = run_with_newcomer(kNewcomer, seed, [&](RankContext& ctx, std::string& log) {
    return plsgd_rank_run(ctx, log, plan, kSteps, kSizes, make_opt, rebuild);
  });
  CHECK(got[0].second == "shrank at 3;grew at " + std::to_string(join_at) + ";");  // the scenario ran
  CHECK(got[kNewcomer].second == "joined at " + std::to_string(join_at) + ";");
  check_bitwise(got, diloco_reference(plan, kSizes, kFragments, kInner, kOuter, kH, kDelay, kSteps).values(),
                kLost);
}
