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
// Every rank's final parameters are compared bitwise with a reference
// defined here, all ranks in one thread: each rank's inner SGD on its own
// gradients; at a prepare, the deltas anchor - p_r of the fragment of the
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
constexpr int kLost = 3;
constexpr std::int64_t kLostAt = 2;  // a prepare: its average fails, and so the sync after it
constexpr int kNewcomer = 5;
constexpr std::int64_t kSteps = 10;

std::vector<int> present(std::int64_t t, std::int64_t join_at) {
  std::vector<int> out;
  for (int r = 0; r <= kNewcomer; ++r)
    if ((r != kLost || t < kLostAt) && (r != kNewcomer || t >= join_at)) out.push_back(r);
  return out;
}

struct RefRank {
  std::vector<Tensor> params;
  std::unique_ptr<Optimizer> inner;
};

/// The reference's replicated part: the anchors, one outer SGD per fragment
/// over them, the average of the fragment prepared last.
struct RefGlobal {
  std::vector<Tensor> anchors = survive_reference::make_params(kSizes);
  std::vector<std::unique_ptr<Optimizer>> outer;
  std::size_t pending = 0;
  bool failed = false;
  std::vector<Tensor> average;  // per parameter of the pending fragment
  RefGlobal() {
    for (const auto& frag : kFragments) {
      std::vector<Tensor> mine;
      for (auto i : frag) mine.push_back(anchors[static_cast<std::size_t>(i)]);
      outer.push_back(make_optimizer(kOuter, {OptimizerParamGroup(mine)}));
    }
  }

  void prepare(std::size_t k, const std::vector<RefRank>& rs, const std::vector<int>& ranks) {
    pending = k;
    average.clear();
    std::int64_t total = 0;
    for (auto i : kFragments[k]) total += kSizes[static_cast<std::size_t>(i)];
    const int n = static_cast<int>(ranks.size());
    std::int64_t base = 0;
    for (auto i : kFragments[k]) {
      const auto ii = static_cast<std::size_t>(i);
      Tensor avg = Tensor::zeros({kSizes[ii]});
      for (std::int64_t e = 0; e < kSizes[ii]; ++e) {
        const float sum = ring_sum(base + e, total, n, [&](int g) {
          const auto& p = rs[static_cast<std::size_t>(ranks[static_cast<std::size_t>(g)])].params[ii];
          return anchors[ii].data<float>()[e] - p.data<float>()[e];
        });
        avg.data<float>()[e] = sum / static_cast<float>(n);
      }
      average.push_back(avg);
      base += kSizes[ii];
    }
  }

  void sync(std::vector<RefRank>& rs, const std::vector<int>& ranks) {
    const auto& frag = kFragments[pending];
    if (!failed) {
      for (std::size_t j = 0; j < frag.size(); ++j) anchors[static_cast<std::size_t>(frag[j])].set_grad(average[j]);
      outer[pending]->step();
      for (auto i : frag) anchors[static_cast<std::size_t>(i)].set_grad(Tensor());
    }
    for (int r : ranks)  // the new anchors (alpha 0), or back to the old ones after a failed average
      for (auto i : frag) rs[static_cast<std::size_t>(r)].params[static_cast<std::size_t>(i)].copy_(anchors[static_cast<std::size_t>(i)]);
  }
};

std::vector<Params> reference(std::int64_t join_at) {
  std::vector<RefRank> rs(kNewcomer + 1);
  auto make = [](std::vector<Tensor> ps) {
    RefRank r{std::move(ps), nullptr};
    r.inner = make_optimizer(kInner, {OptimizerParamGroup(r.params)});
    return r;
  };
  for (int r = 0; r < kNewcomer; ++r) rs[static_cast<std::size_t>(r)] = make(survive_reference::make_params(kSizes));
  RefGlobal global;
  for (std::int64_t t = 0; t < kSteps; ++t) {
    if (t == join_at) {  // a copy of rank 0, the lowest-ranked member
      std::vector<Tensor> ps;
      for (const auto& p : rs[0].params) ps.push_back(p.clone());
      rs[kNewcomer] = make(ps);
      rs[kNewcomer].inner->load_state_dict(rs[0].inner->state_dict());
    }
    const auto ranks = present(t, join_at);
    for (int r : ranks) {
      set_rank_grads(rs[static_cast<std::size_t>(r)].params, r, t);
      rs[static_cast<std::size_t>(r)].inner->step();
    }
    const std::int64_t l = t % kH + 1;
    if (l == kH - kDelay) {
      global.failed = t == kLostAt;
      global.prepare(static_cast<std::size_t>((t / kH) % 2), rs, ranks);
    }
    if (l == kH) global.sync(rs, ranks);
  }
  std::vector<Params> out;
  for (const auto& r : rs) out.push_back(values_of(r.params));
  return out;
}

std::unique_ptr<PostLocalSGDOptimizer> make_opt(const std::vector<Tensor>& params, const ProcessGroup& g) {
  DiLoCoOptions o;
  o.sync_every = kH * static_cast<std::int64_t>(kFragments.size());
  o.fragments = kFragments;
  o.fragment_sync_delay = kDelay;
  o.outer_optimizer = kOuter;
  return std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                 std::make_unique<DiLoCoAverager>(params, o, g));
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
    log += "joined at " + std::to_string(opt->averager().step()) + ";";
  } else {
    opt = make_opt(params, ctx.world());
  }
  while (opt->averager().step() < kSteps) {
    const std::int64_t t = opt->averager().step();
    if (t == join_at && !ctx.newcomer()) {
      ProcessGroup old = opt->averager().process_group();
      post_local_sgd_catch_up(*opt, old.grow());
      log += "grew at " + std::to_string(t) + ";";
    }
    if (me == kLost && t == kLostAt) throw Lost();
    set_rank_grads(params, me, t);
    try {
      opt->step();
    } catch (const PeerLostError&) {
      // The failed fragment is back at its anchors: the survivors go on with
      // the same state over the shrunk group (docs/diloco.md).
      const StateDict sd = opt->state_dict();
      ProcessGroup old = opt->averager().process_group();
      opt = make_opt(params, old.shrink().group);
      opt->load_state_dict(sd);
      log += "shrank at " + std::to_string(t) + ";";
    }
  }
  return values_of(params);
}

}  // namespace

TEST_CASE("DiLoCo catch-up: a rank lost at step 2, a newcomer later, with and without a fragment in flight: "
          "every rank bitwise the reference",
          "[diloco][grow]") {
  const std::int64_t join_at = GENERATE(4, 5);  // nothing in flight, fragment 0 in flight
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("join at " << join_at << ", seed " << seed);
  const auto got = run_with_newcomer(
      kNewcomer, seed, [&](RankContext& ctx, std::string& log) { return rank_run(ctx, log, join_at); });
  CHECK(got[0].second == "shrank at 3;grew at " + std::to_string(join_at) + ";");  // the scenario ran
  CHECK(got[kNewcomer].second == "joined at " + std::to_string(join_at) + ";");
  check_bitwise(got, reference(join_at), kLost);
}
