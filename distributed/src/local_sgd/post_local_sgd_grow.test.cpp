// PostLocalSGDOptimizer growing back (post_local_sgd_catch_up) between the
// ranks of a deterministic simulation: 5 ranks train with Adam and a
// PeriodicModelAverager (averages at steps 1, 3, 5, ...), surviving losses;
// rank 3 is lost before step 2's gradients, the survivors notice it at step
// 3's average, shrink and average over the four of them; a newcomer (rank 5)
// joins before step join_at and catches up from the lowest-ranked member.
// Every rank's final parameters are compared bitwise with the reference
// (grow_reference.hpp, periodic_reference), all ranks in one thread: each
// rank's own Adam on its own gradients; at each averaging step the ranks
// there then (ascending) set to sum_r (p_r / n) in gloo's ring order; the
// newcomer, at join_at, a copy of rank 0's parameters and Adam state.
//
// Then with a HierarchicalModelAverager. The optimizer has no
// enable_survive (only the periodic averager has it), so every step starts
// with a barrier of the averager's group (grow_test_support.hpp,
// plsgd_rank_run): the survivors see a rank lost at step 2 there, before any
// average, and go on with the same state over the shrunk group with a new
// averager (state_dict, shrink, a HierarchicalModelAverager over the shrunk
// group, load_state_dict). Before step join_at the members grow the group
// and catch up; the newcomers build their averager over the grown group and
// receive the state of the lowest-ranked member (its step among it).
// The map over a group of n ranks is levels(n) (the last level the whole
// group). Every rank's final parameters are compared bitwise with the
// reference (grow_reference.hpp, hierarchical_reference), all ranks in one
// thread: each rank's own Adam on its own gradients; from the warm-up on, at
// step t the level of the largest period dividing t averages the ranks there
// in consecutive blocks of its group size, each block in gloo's ring order
// (sum_r (p_r / n)); the newcomers, at join_at, copies of rank 0's parameters
// and Adam state.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dopt/distributed/averagers.hpp"
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
  check_bitwise(got, periodic_reference(plan, kSizes, kInner, kWarmup, kPeriod, kSteps).values(), kLost);
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

namespace {

using Levels = std::map<std::int64_t, int> (*)(int);

/// Two levels whose subgroups are single ranks (so they divide every group
/// size): period 2 on each rank alone, period 3 on the whole group.
std::map<std::int64_t, int> single_levels(int n) { return {{2, 1}, {3, n}}; }
/// Pairs where the group size is even, single ranks elsewhere; period 4 on
/// the whole group.
std::map<std::int64_t, int> pair_levels(int n) { return {{2, n % 2 == 0 ? 2 : 1}, {4, n}}; }

MakeOptimizer maker(Levels levels) {
  return [levels](const std::vector<Tensor>& params, const ProcessGroup& g) {
    return std::make_unique<PostLocalSGDOptimizer>(
        make_optimizer(kInner, {OptimizerParamGroup(params)}),
        std::make_unique<HierarchicalModelAverager>(levels(g.size()), kWarmup, g));
  };
}

/// A survivor goes on with the same state over the shrunk group.
std::function<void(std::unique_ptr<PostLocalSGDOptimizer>&)> rebuilder(Levels levels) {
  return [levels](std::unique_ptr<PostLocalSGDOptimizer>& opt) {
    const StateDict sd = opt->state_dict();
    ProcessGroup old = opt->averager().process_group();
    std::vector<Tensor> params = opt->param_groups().at(0).params;
    opt = maker(levels)(params, old.shrink().group);
    opt->load_state_dict(sd);
  };
}

}  // namespace

TEST_CASE(
    "HierarchicalModelAverager grows back: a rank lost at step 2, a newcomer later, world 3 and 5: every rank "
    "bitwise the reference",
    "[post_local_sgd][grow][averagers]") {
  const int world = GENERATE(3, 5);
  const std::int64_t join_at = GENERATE(4, 5);  // between whole-group averages, and right before one
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("world " << world << ", join at " << join_at << ", seed " << seed);
  const Plan plan{/*lost=*/1, kLostAt, /*newcomer=*/world, join_at};
  const auto got = run_with_newcomer(world, seed, [&](RankContext& ctx, std::string& log) {
    return plsgd_rank_run(ctx, log, plan, kSteps, kSizes, maker(single_levels), rebuilder(single_levels),
                          /*barrier_each_step=*/true);
  });
  CHECK(got[0].second == "shrank at 2;grew at " + std::to_string(join_at) + ";");  // the scenario ran
  CHECK(got[static_cast<std::size_t>(world)].second == "joined at " + std::to_string(join_at) + ";");
  check_bitwise(got, hierarchical_reference(plan, kSizes, kInner, kWarmup, single_levels, kSteps).values(), 1);
}

TEST_CASE(
    "HierarchicalModelAverager grows back with subgroups that change: 5 ranks, pairs over the 4 survivors, "
    "two newcomers make 3 pairs: every rank bitwise the reference",
    "[post_local_sgd][grow][averagers]") {
  // 5 ranks {2: 1, 4: 5}; rank 1 lost at step 2; the survivors 0, 2, 3, 4
  // average in pairs {0, 2} {3, 4} ({2: 2, 4: 4}); newcomers 5 and 6 join
  // before join_at: the members' averager rebuilds {2: 2, 4: 6} over the
  // grown group (pairs {0, 2} {3, 4} {5, 6}), the newcomers build it alike.
  const std::int64_t join_at = GENERATE(4, 5);  // right before a whole-group average, and between
  INFO("join at " << join_at);
  const Plan plan{/*lost=*/1, kLostAt, /*newcomer=*/5, join_at, /*newcomers=*/2};
  constexpr std::int64_t steps = 12;
  const auto got = run_with_newcomer(
      5, 3,
      [&](RankContext& ctx, std::string& log) {
        Params out = plsgd_rank_run(ctx, log, plan, steps, kSizes, maker(pair_levels), rebuilder(pair_levels),
                                    /*barrier_each_step=*/true);
        return out;
      },
      /*newcomers=*/2);
  CHECK(got[0].second == "shrank at 2;grew at " + std::to_string(join_at) + ";");
  CHECK(got[5].second == "joined at " + std::to_string(join_at) + ";");
  CHECK(got[6].second == "joined at " + std::to_string(join_at) + ";");
  check_bitwise(got, hierarchical_reference(plan, kSizes, kInner, kWarmup, pair_levels, steps).values(), 1);
}

TEST_CASE("HierarchicalModelAverager over a grown group: the subgroups, and the step the newcomer takes",
          "[post_local_sgd][grow][averagers]") {
  // 4 ranks {2: 2, 4: 4} (pairs {0, 1} {2, 3}), no loss; two newcomers join
  // after 3 steps: every rank of the grown group averages in pairs {0, 1}
  // {2, 3} {4, 5} at period 2 and on all 6 at period 4, from step 3 on.
  const auto got = run_with_newcomer(
      4, 5,
      [](RankContext& ctx, std::string& log) {
        auto params = survive_reference::make_params(kSizes);
        std::unique_ptr<PostLocalSGDOptimizer> opt;
        GrowResult grown;
        if (ctx.newcomer()) {
          grown = join_patiently(ctx);
          opt = maker(pair_levels)(params, grown.group);
        } else {
          opt = maker(pair_levels)(params, ctx.world());
          for (std::int64_t t = 0; t < 3; ++t) {
            set_rank_grads(params, ctx.rank(), t);
            opt->step();
          }
          ProcessGroup old = ctx.world();
          GrowOptions two;
          two.newcomers = 2;
          grown = old.grow(two);
        }
        post_local_sgd_catch_up(*opt, grown);
        const auto& a = dynamic_cast<const HierarchicalModelAverager&>(opt->averager());
        log += "step " + std::to_string(a.step()) + " size " + std::to_string(a.process_group().size()) + ";";
        for (const auto& [period, g] : a.period_process_groups())
          log += std::to_string(period) + ": " + ranks_of(g.ranks()) + ";";
        return values_of(params);
      },
      /*newcomers=*/2);
  const std::vector<std::string> pairs = {"0,1", "0,1", "2,3", "2,3", "4,5", "4,5"};
  for (std::size_t r = 0; r < 6; ++r) CHECK(got[r].second == "step 3 size 6;2: " + pairs[r] + ";4: 0,1,2,3,4,5;");
  CHECK(got[4].first == got[0].first);  // the newcomers hold rank 0's parameters
  CHECK(got[5].first == got[0].first);
}

TEST_CASE("HierarchicalModelAverager refuses a grown group its group sizes do not divide",
          "[post_local_sgd][grow][averagers]") {
  // 4 ranks {2: 2, 4: 4}; one newcomer makes 5, which 2 does not divide: the
  // members' catch-up refuses before anything is sent or made (their
  // averager stays over the 4), the newcomer's constructor refuses {2: 2, 4: 5}.
  const auto got = run_with_newcomer(4, 9, [](RankContext& ctx, std::string& log) {
    auto params = survive_reference::make_params(kSizes);
    const auto levels = [](int n) { return std::map<std::int64_t, int>{{2, 2}, {4, n}}; };
    try {
      if (ctx.newcomer()) {
        auto grown = join_patiently(ctx);
        HierarchicalModelAverager a(levels(grown.group.size()), kWarmup, grown.group);
        log += "built;";
      } else {
        PostLocalSGDOptimizer opt(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                  std::make_unique<HierarchicalModelAverager>(levels(4), kWarmup, ctx.world()));
        ProcessGroup old = ctx.world();
        try {
          post_local_sgd_catch_up(opt, old.grow());
          log += "took it;";
        } catch (const ValueError& e) {
          log += std::string(e.what()) + ";";
        }
        log += "size " + std::to_string(opt.averager().process_group().size()) + ";";
      }
    } catch (const ValueError& e) {
      log += std::string(e.what()) + ";";
    }
    return values_of(params);
  });
  for (int r = 0; r < 4; ++r) {
    const std::string& log = got[static_cast<std::size_t>(r)].second;
    INFO(log);
    CHECK(log.find("post_local_sgd_catch_up [rank " + std::to_string(r) +
                   "]: HierarchicalModelAverager cannot go on over the grown group of 5 ranks: the group size 2 "
                   "of period 2 does not divide 5") == 0);
    CHECK(log.find(";size 4;") != std::string::npos);
  }
  INFO(got[4].second);
  CHECK(got[4].second.find("HierarchicalModelAverager") == 0);
  CHECK(got[4].second.find("must be positive and divide the size 5 of the process group") != std::string::npos);
}

namespace {

/// A newcomer's averager built otherwise than the members': what each rank
/// raised (its log), or "ok;" when its catch-up went through.
struct Mismatch {
  int world;
  int newcomers;
  std::function<std::unique_ptr<ModelAverager>(const ProcessGroup&)> member;
  std::function<std::unique_ptr<ModelAverager>(const ProcessGroup&)> newcomer;
};

std::vector<std::pair<Params, std::string>> run_mismatch(const Mismatch& m) {
  return run_with_newcomer(
      m.world, 11,
      [&m](RankContext& ctx, std::string& log) {
        auto params = survive_reference::make_params(kSizes);
        try {
          std::unique_ptr<PostLocalSGDOptimizer> opt;
          GrowResult grown;
          if (ctx.newcomer()) {
            grown = join_patiently(ctx);
            opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                          m.newcomer(grown.group));
          } else {
            opt = std::make_unique<PostLocalSGDOptimizer>(make_optimizer(kInner, {OptimizerParamGroup(params)}),
                                                          m.member(ctx.world()));
            for (std::int64_t t = 0; t < 3; ++t) {
              set_rank_grads(params, ctx.rank(), t);
              opt->step();
            }
            ProcessGroup old = ctx.world();
            GrowOptions more;
            more.newcomers = m.newcomers;
            grown = old.grow(more);
          }
          post_local_sgd_catch_up(*opt, grown);
          log += "ok;";
        } catch (const ValueError& e) {
          log += e.what();
        }
        return values_of(params);
      },
      m.newcomers);
}

std::function<std::unique_ptr<ModelAverager>(const ProcessGroup&)> hierarchical(std::map<std::int64_t, int> levels,
                                                                                std::int64_t warmup = kWarmup) {
  return [levels, warmup](const ProcessGroup& g) {
    auto l = levels;
    l.rbegin()->second = g.size();
    return std::make_unique<HierarchicalModelAverager>(l, warmup, g);
  };
}

std::function<std::unique_ptr<ModelAverager>(const ProcessGroup&)> periodic(std::int64_t period,
                                                                            std::int64_t warmup = kWarmup) {
  return [period, warmup](const ProcessGroup& g) { return std::make_unique<PeriodicModelAverager>(period, warmup, g); };
}

/// Every rank raised the mismatch at once (no rank timed out): the newcomers
/// (group ranks `first` on, the first of them differing first) name
/// `newcomer_op`, the members post_local_sgd_catch_up; each its own rank,
/// `first`, and both configurations.
void check_refused(const std::vector<std::pair<Params, std::string>>& got, int first, const std::string& newcomer_op,
                   const std::string& theirs, const std::string& ours) {
  for (std::size_t r = 0; r < got.size(); ++r) {
    const std::string& log = got[r].second;
    INFO("rank " << r << ": " << log);
    const std::string rank = "[rank " + std::to_string(r) + "]: ";
    const std::string both = ", " + theirs + ", differs from group rank 0's, " + ours + ": ";
    const std::string op = static_cast<int>(r) >= first ? newcomer_op : "post_local_sgd_catch_up";
    if (static_cast<int>(r) == first) {
      CHECK(log.find(op + " " + rank + "this rank's averager (group rank " + std::to_string(first) + ", global rank " +
                     std::to_string(first) + ")" + both) == 0);
    } else {
      CHECK(log.find(op + " " + rank + "the averager of group rank " + std::to_string(first) + ", global rank " +
                     std::to_string(first) + both) == 0);
    }
  }
}

}  // namespace

TEST_CASE("post_local_sgd_catch_up: newcomers whose HierarchicalModelAverager map or warm-up differs from the members'",
          "[post_local_sgd][grow][averagers]") {
  // 4 ranks {2: 2, 4: 4}, two newcomers. {2: 1, 4: 6} went through
  // unnoticed (the newcomers averaged alone at period 2), {2: 3, 4: 6} hung
  // until the timeout; a warm-up of 2 went through unnoticed. Now every rank
  // raises ValueError in the same exchange: the newcomers from their
  // averager's constructor, the members from the catch-up.
  const auto [levels, warmup, text] = GENERATE(table<std::map<std::int64_t, int>, std::int64_t, std::string>(
      {{{{2, 1}, {4, 6}}, kWarmup, "{2: 1, 4: 6}, warm-up 1"},
       {{{2, 3}, {4, 6}}, kWarmup, "{2: 3, 4: 6}, warm-up 1"},
       {{{2, 2}, {4, 6}}, 2, "{2: 2, 4: 6}, warm-up 2"}}));
  INFO(text);
  const auto got = run_mismatch({4, 2, hierarchical({{2, 2}, {4, 4}}), hierarchical(levels, warmup)});
  check_refused(got, 4, "HierarchicalModelAverager", "HierarchicalModelAverager " + text,
                "HierarchicalModelAverager {2: 2, 4: 6}, warm-up 1");
}

TEST_CASE("post_local_sgd_catch_up: a newcomer's HierarchicalModelAverager map differs, world 3 and 5",
          "[post_local_sgd][grow][averagers]") {
  // 3 ranks {2: 1, 4: 3} grow to 4, the newcomer builds pairs (it used to
  // wait for rank 2 to make a pair with it); 5 ranks {2: 1, 4: 5} grow to 6,
  // the newcomer builds pairs, or triples.
  const int world = GENERATE(3, 5);
  const int block = GENERATE(2, 3);
  if (world == 3 && block == 3) return;  // 3 does not divide 4
  INFO("world " << world << ", block " << block);
  const auto got = run_mismatch({world, 1, hierarchical({{2, 1}, {4, world}}), hierarchical({{2, block}, {4, 0}})});
  const std::string n = std::to_string(world + 1);
  check_refused(got, world, "HierarchicalModelAverager",
                "HierarchicalModelAverager {2: " + std::to_string(block) + ", 4: " + n + "}, warm-up 1",
                "HierarchicalModelAverager {2: 1, 4: " + n + "}, warm-up 1");
}

TEST_CASE("post_local_sgd_catch_up: a newcomer's PeriodicModelAverager period or warm-up differs, world 3 and 5",
          "[post_local_sgd][grow][averagers]") {
  const int world = GENERATE(3, 5);
  const auto [period, warmup] = GENERATE(table<std::int64_t, std::int64_t>({{3, kWarmup}, {kPeriod, 0}}));
  INFO("world " << world << ", period " << period << ", warm-up " << warmup);
  const auto got = run_mismatch({world, 1, periodic(kPeriod), periodic(period, warmup)});
  check_refused(got, world, "post_local_sgd_catch_up",
                "PeriodicModelAverager period " + std::to_string(period) + ", warm-up " + std::to_string(warmup),
                "PeriodicModelAverager period 2, warm-up 1");
}

TEST_CASE("post_local_sgd_catch_up: a newcomer's averager of another kind than the members'",
          "[post_local_sgd][grow][averagers]") {
  // The periodic averager's exchange in the catch-up meets the hierarchical
  // one's where its levels are made, either way round.
  const bool newcomer_periodic = GENERATE(true, false);
  INFO("newcomer periodic " << newcomer_periodic);
  const auto hier = hierarchical({{2, 1}, {4, 0}});
  const auto got =
      run_mismatch({3, 1, newcomer_periodic ? hier : periodic(kPeriod), newcomer_periodic ? periodic(kPeriod) : hier});
  const std::string h = "HierarchicalModelAverager {2: 1, 4: 4}, warm-up 1";
  const std::string p = "PeriodicModelAverager period 2, warm-up 1";
  if (newcomer_periodic)
    check_refused(got, 3, "post_local_sgd_catch_up", p, h);
  else
    check_refused(got, 3, "HierarchicalModelAverager", h, p);
}

TEST_CASE("post_local_sgd_catch_up: its sends' and receives' errors name it", "[post_local_sgd][grow]") {
  // The newcomer is lost after it joined, before its catch-up: the members'
  // catch-up fails naming the call (it named the ProcessGroup method before).
  const int world = GENERATE(3, 5);
  const auto got = run_with_newcomer(world, 13, [](RankContext& ctx, std::string& log) {
    auto params = survive_reference::make_params(kSizes);
    if (ctx.newcomer()) {
      join_patiently(ctx);
      throw Lost();
    }
    auto opt = make_opt(params, ctx.world());
    ProcessGroup old = ctx.world();
    try {
      post_local_sgd_catch_up(*opt, old.grow());
      log += "ok;";
    } catch (const Error& e) {
      log += e.what();
    }
    return values_of(params);
  });
  for (int r = 0; r < world; ++r) {
    const std::string& log = got[static_cast<std::size_t>(r)].second;
    INFO("rank " << r << ": " << log);
    CHECK(log.find("post_local_sgd_catch_up()") != std::string::npos);
  }
}
