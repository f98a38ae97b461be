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
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dopt/distributed/averagers.hpp"
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

TEST_CASE(
    "DiLoCo catch-up: a rank lost at step 2, a newcomer later, with and without a fragment in flight: "
    "every rank bitwise the reference",
    "[diloco][grow]") {
  // World 5 loses rank 3, world 3 rank 1; the newcomer is rank `world`.
  const int world = GENERATE(3, 5);
  const std::int64_t join_at = GENERATE(4, 5);  // nothing in flight, fragment 0 in flight
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("world " << world << ", join at " << join_at << ", seed " << seed);
  const int lost = world == 5 ? kLost : 1;
  const Plan plan{lost, kLostAt, world, join_at};
  const auto got = run_with_newcomer(world, seed, [&](RankContext& ctx, std::string& log) {
    return plsgd_rank_run(ctx, log, plan, kSteps, kSizes, make_opt, rebuild);
  });
  CHECK(got[0].second == "shrank at 3;grew at " + std::to_string(join_at) + ";");  // the scenario ran
  CHECK(got[static_cast<std::size_t>(world)].second == "joined at " + std::to_string(join_at) + ";");
  check_bitwise(got, diloco_reference(plan, kSizes, kFragments, kInner, kOuter, kH, kDelay, kSteps).values(), lost);
}

namespace {

/// A setting a newcomer's DiLoCoAverager is built with otherwise than the
/// members': `base` makes both sides' options, `differ` changes the
/// newcomer's; the message names `setting` with the members' value `ours`
/// and the newcomer's `theirs` (`sizes`: the newcomer's parameters), then
/// `also` when a second setting follows from the first (the point-to-point
/// tag of a quantized format).
struct Differ {
  std::string setting;
  std::function<void(DiLoCoOptions&)> base;
  std::function<void(DiLoCoOptions&)> differ;
  std::string ours;
  std::string theirs;
  std::vector<std::int64_t> sizes = kSizes;
  std::vector<std::string> also = {};  // setting, ours, theirs
};

DiLoCoOptions options_of(const std::function<void(DiLoCoOptions&)>& change) {
  DiLoCoOptions o;
  o.sync_every = kH * static_cast<std::int64_t>(kFragments.size());
  o.fragments = kFragments;
  o.fragment_sync_delay = kDelay;
  o.outer_optimizer = kOuter;
  change(o);
  return o;
}

/// `world` members step 3 times (fragment 1 then in flight; the quantized
/// formats' worker threads do not run in the deterministic simulation: no
/// steps there), grow by one and catch up; the newcomer builds its averager
/// with d.differ and catches up. What each rank raised (its log), or "ok;".
std::vector<std::pair<Params, std::string>> run_differ(int world, const Differ& d) {
  return run_with_newcomer(world, 17, [&](RankContext& ctx, std::string& log) {
    auto params = survive_reference::make_params(ctx.newcomer() ? d.sizes : kSizes);
    try {
      std::unique_ptr<PostLocalSGDOptimizer> opt;
      GrowResult grown;
      DiLoCoOptions o = options_of(d.base);
      if (ctx.newcomer()) {
        grown = join_patiently(ctx);
        d.differ(o);
        opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                      std::make_unique<DiLoCoAverager>(params, o, grown.group));
      } else {
        opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                      std::make_unique<DiLoCoAverager>(params, o, ctx.world()));
        for (std::int64_t t = 0; o.wire_format == WireFormat::float32 && t < 3; ++t) {
          set_rank_grads(params, ctx.rank(), t);
          opt->step();
        }
        ProcessGroup old = ctx.world();
        grown = old.grow();
      }
      post_local_sgd_catch_up(*opt, grown);
      log += "ok;";
    } catch (const ValueError& e) {
      log += e.what();
    }
    return values_of(params);
  });
}

/// OptimizerSpec::to_json of outer SGD with its defaults filled in.
std::string sgd_json(const std::string& lr, const std::string& momentum, const std::string& nesterov) {
  return "{\"hyperparameters\":{\"dampening\":0.0,\"lr\":" + lr + ",\"maximize\":false,\"momentum\":" + momentum +
         ",\"nesterov\":" + nesterov + ",\"weight_decay\":0.0},\"name\":\"SGD\"}";
}

void int8(DiLoCoOptions& o) { o.wire_format = WireFormat::int8; }
void same(DiLoCoOptions&) {}

const std::vector<Differ>& differs() {
  static const std::vector<Differ> all = {
      {"sync_every", same, [](DiLoCoOptions& o) { o.sync_every = 8; }, "4", "8"},
      {"fragments", same,
       [](DiLoCoOptions& o) {
         o.fragments = {{0, 1, 2}, {3, 4, 5}};
       },
       "[[0, 2, 4], [1, 3, 5]]", "[[0, 1, 2], [3, 4, 5]]"},
      {"fragments", same, [](DiLoCoOptions& o) { o.fragments.clear(); },  // one fragment, H = 4
       "[[0, 2, 4], [1, 3, 5]]", "[[0, 1, 2, 3, 4, 5]]"},
      {"fragment_sync_delay", same, [](DiLoCoOptions& o) { o.fragment_sync_delay = 0; }, "1", "0"},
      {"fragment_update_alpha", same, [](DiLoCoOptions& o) { o.fragment_update_alpha = 0.25; }, "0", "0.25"},
      {"outer_optimizer", same, [](DiLoCoOptions& o) { o.outer_optimizer.hyperparameters["lr"] = 0.5; },
       sgd_json("0.7", "0.9", "true"), sgd_json("0.5", "0.9", "true")},
      {"outer_optimizer", same,
       [](DiLoCoOptions& o) {
         o.outer_optimizer.hyperparameters = {{"lr", 0.7}, {"momentum", 0.8}};
       },
       sgd_json("0.7", "0.9", "true"), sgd_json("0.7", "0.8", "false")},
      {"outer_optimizer", same,
       [](DiLoCoOptions& o) {
         o.outer_optimizer.hyperparameters = {{"lr", 0.7}, {"momentum", 0.9}};
       },
       sgd_json("0.7", "0.9", "true"), sgd_json("0.7", "0.9", "false")},
      {"outer_optimizer", same,
       [](DiLoCoOptions& o) {
         o.outer_optimizer = {"Adam", {{"lr", 0.7}}};
       },
       sgd_json("0.7", "0.9", "true"),
       "{\"hyperparameters\":{\"amsgrad\":false,\"betas\":[0.9,0.999],\"eps\":1e-08,\"lr\":0.7,\"maximize\":false,"
       "\"weight_decay\":0.0},\"name\":\"Adam\"}"},
      {"wire_format",
       same,
       [](DiLoCoOptions& o) { o.wire_format = WireFormat::bfloat16; },
       "float32",
       "bfloat16",
       kSizes,
       {"wire_tag", "unused", std::to_string(DiLoCoOptions{}.wire_tag)}},
      {"error_feedback", int8, [](DiLoCoOptions& o) { o.error_feedback = true; }, "false", "true"},
      {"row_size", int8, [](DiLoCoOptions& o) { o.row_size = 128; }, "256", "128"},
      {"wire_tag", int8, [](DiLoCoOptions& o) { o.wire_tag += 2; }, std::to_string(DiLoCoOptions{}.wire_tag),
       std::to_string(DiLoCoOptions{}.wire_tag + 2)},
      {"parameters",
       same,
       same,
       "6: float32[257] float32[64] float32[3000] float32[33] float32[5] float32[300]",
       "6: float32[257] float32[64] float32[3000] float32[33] float32[5] float32[301]",
       {257, 64, 3000, 33, 5, 301}},
  };
  return all;
}

}  // namespace

TEST_CASE(
    "DiLoCo catch-up: a newcomer whose DiLoCoAverager is built otherwise raises ValueError on every rank, "
    "naming the setting, the ranks and both values, world 3 and 5",
    "[diloco][grow][averagers]") {
  const int world = GENERATE(3, 5);
  const std::size_t which = GENERATE(range<std::size_t>(0, 14));
  REQUIRE(differs().size() == 14);
  const Differ& d = differs()[which];
  INFO("world " << world << ", " << d.setting << ": " << d.ours << " / " << d.theirs);
  const auto got = run_differ(world, d);
  const std::string members = world == 3 ? "ranks 0-2" : "ranks 0-4";
  const std::string newcomer = ", rank " + std::to_string(world) + " has ";
  std::string text = "the ranks' DiLoCoAverager settings differ (global ranks): " + d.setting + ": " + members +
                     " have " + d.ours + newcomer + d.theirs;
  if (!d.also.empty()) text += "; " + d.also[0] + ": " + members + " have " + d.also[1] + newcomer + d.also[2];
  text += ": every rank of the group must build the same DiLoCoAverager";
  REQUIRE(got.size() == static_cast<std::size_t>(world + 1));
  for (std::size_t r = 0; r < got.size(); ++r) {
    INFO("rank " << r << ": " << got[r].second);
    CHECK(got[r].second.find("post_local_sgd_catch_up [rank " + std::to_string(r) + "]: " + text) == 0);
  }
}

TEST_CASE(
    "DiLoCo catch-up: a newcomer whose outer optimizer spec names the defaults the members' leaves out "
    "goes through, world 3 and 5",
    "[diloco][grow][averagers]") {
  // The comparison is of the outer optimizer with its defaults filled in.
  const int world = GENERATE(3, 5);
  INFO("world " << world);
  const Differ d{"outer_optimizer", same,
                 [](DiLoCoOptions& o) {
                   o.outer_optimizer.hyperparameters["dampening"] = 0.0;
                   o.outer_optimizer.hyperparameters["weight_decay"] = 0.0;
                 },
                 "", ""};
  const auto got = run_differ(world, d);
  for (std::size_t r = 0; r < got.size(); ++r) {
    INFO("rank " << r);
    CHECK(got[r].second == "ok;");
  }
  CHECK(got[static_cast<std::size_t>(world)].first == got[0].first);  // the newcomer holds rank 0's parameters
}

TEST_CASE("DiLoCo catch-up: a newcomer's averager of another kind than the members' DiLoCoAverager",
          "[diloco][grow][averagers]") {
  // The periodic averager's exchange in the catch-up, and the hierarchical
  // one's in its constructor over the grown group, meet DiLoCo's in its
  // take_grown_group.
  const bool periodic = GENERATE(true, false);
  INFO("newcomer periodic " << periodic);
  const auto got = run_with_newcomer(3, 19, [periodic](RankContext& ctx, std::string& log) {
    auto params = survive_reference::make_params(kSizes);
    try {
      if (ctx.newcomer()) {
        GrowResult grown = join_patiently(ctx);
        std::unique_ptr<ModelAverager> a;
        if (periodic)
          a = std::make_unique<PeriodicModelAverager>(2, 0, grown.group);
        else
          a = std::make_unique<HierarchicalModelAverager>(std::map<std::int64_t, int>{{2, 1}, {4, 4}}, 1, grown.group);
        PostLocalSGDOptimizer opt(make_optimizer(kInner, {OptimizerParamGroup(params)}), std::move(a));
        post_local_sgd_catch_up(opt, grown);
      } else {
        auto opt = make_opt(params, ctx.world());
        ProcessGroup old = ctx.world();
        post_local_sgd_catch_up(*opt, old.grow());
      }
      log += "ok;";
    } catch (const ValueError& e) {
      log += e.what();
    }
    return values_of(params);
  });
  const std::string kind =
      periodic ? "PeriodicModelAverager period 2, warm-up 0" : "HierarchicalModelAverager {2: 1, 4: 4}, warm-up 1";
  REQUIRE(got.size() == 4);
  for (std::size_t r = 0; r < got.size(); ++r) {
    INFO("rank " << r << ": " << got[r].second);
    const std::string op = r == 3 && !periodic ? "HierarchicalModelAverager" : "post_local_sgd_catch_up";
    CHECK(got[r].second.find(op + " [rank " + std::to_string(r) + "]: ") == 0);
    CHECK(got[r].second.find("group rank 3, global rank 3") != std::string::npos);
    CHECK(got[r].second.find(kind + ", differs from group rank 0's, DiLoCoAverager") != std::string::npos);
  }
}
