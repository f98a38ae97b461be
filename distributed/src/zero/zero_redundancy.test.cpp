// ZeroRedundancyOptimizer with redundancy over simulated ranks: ranks are
// lost (their function throws) at every point of a step, the survivors
// recover and go on, and their final parameters are compared bitwise with a
// reference run defined here.
//
// The reference run and the gradients: zero_survive_reference.hpp.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/internal/shm.hpp"
#include "zero_survive_reference.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

struct Killed : std::runtime_error {
  Killed() : std::runtime_error("killed by the test") {}
};

using survive_reference::Kill;

const std::vector<std::int64_t> kSizes = {257, 64, 3000, 33, 5, 300, 1, 70001, 12};

std::vector<Tensor> make_params() { return survive_reference::make_params(kSizes); }

struct Scenario {
  int n = 3;
  int redundancy = 1;
  std::vector<Kill> kills{};
  std::int64_t steps = 5;
  OptimizerSpec spec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
  bool bucket_view = false;
  bool callback = false;
  ZeroBuddyUpdate update = ZeroBuddyUpdate::step;
  int interval = 4;                // snapshot_interval (replay)
  std::vector<std::string> hosts{};  // ZeroOptions::hosts (empty: one host)
  bool scheduler = false;          // LambdaLR changing lr at every step, in both runs
  std::int64_t chunk = 1000;       // host_memory_chunk (host_memory)
};

const OptimizerSpec kMomentumSgd{"SGD", {{"lr", 0.1}, {"momentum", 0.9}}};

/// The scheduler of Scenario::scheduler: a different lr at every step.
double lr_factor(std::int64_t epoch) { return 1.0 + 0.25 * static_cast<double>(epoch % 3); }

/// M_t (zero_survive_reference.hpp).
std::vector<std::vector<int>> expected_members(const Scenario& sc) {
  return survive_reference::members_per_step(sc.n, sc.kills, sc.steps);
}

std::vector<std::vector<float>> reference(const Scenario& sc) {
  survive_reference::AfterStep sched;
  if (sc.scheduler)
    sched = [](Optimizer& o) {
      auto s = std::make_shared<LambdaLR>(o, lr_factor);
      return std::function<void()>([s] { s->step(); });
    };
  std::vector<std::vector<float>> out;
  for (const auto& p : survive_reference::reference_params(kSizes, sc.spec, sc.n, sc.kills, sc.steps, sched))
    out.push_back(p.to_vector<float>());
  return out;
}

struct RankResult {
  bool survived = false;
  std::vector<std::vector<float>> params;
  std::vector<std::vector<int>> members;  // per completed step: whose gradients it averaged
  std::string log;                        // recoveries and errors, in order
  int final_size = 0;
};

std::string ranks_str(const std::vector<int>& r) {
  std::string s;
  for (int x : r) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

std::vector<RankResult> run(const Scenario& sc) {
  std::vector<RankResult> res(static_cast<std::size_t>(sc.n));
  std::mutex mu;
  SimulateOptions so;
  so.timeout = std::chrono::seconds(30);
  auto fn = [&](RankContext& ctx) {
    const int me = ctx.rank();
    RankResult out;
    auto dies = [&](std::int64_t step, const std::string& point, int index) {
      for (const auto& k : sc.kills)
        if (k.rank == me && k.step == step && k.point == point &&
            ((point != "broadcast" && point != "chunk") || k.index == index))
          return true;
      return false;
    };
    ProcessGroup world = ctx.world();
    auto params = make_params();
    ZeroOptions zo{world};
    zo.redundancy = sc.redundancy;
    zo.parameters_as_bucket_view = sc.bucket_view;
    zo.buddy_update = sc.update;
    zo.snapshot_interval = sc.interval;
    zo.hosts = sc.hosts;
    zo.host_memory_chunk = sc.chunk;
    zo.probe = [&](const char* point, std::int64_t step, int index) {
      if (dies(step, point, index)) throw Killed();
    };
    bool changed = false;
    if (sc.callback)
      zo.on_membership_change = [&](const ZeroRecovery& r) {
        world = r.group;
        changed = true;
        out.log += "callback lost=" + ranks_str(r.lost) + " step=" + std::to_string(r.step) + ";";
      };
    ZeroRedundancyOptimizer zero(params, sc.spec, zo);
    std::unique_ptr<LambdaLR> sched;
    if (sc.scheduler) sched = std::make_unique<LambdaLR>(zero, lr_factor);
    while (zero.step_count() < sc.steps) {
      const std::int64_t t = zero.step_count();
      const std::vector<int> members = world.ranks();
      try {
        if (dies(t, "between", 0)) throw Killed();
        survive_reference::set_mean_grads(params, world, me, t);
        changed = false;
        zero.step();
        if (sched) sched->step();
        out.members.push_back(members);
      } catch (const MembershipChangedError& e) {
        world = e.recovery().group;
        if (sched) sched->step();  // the step was completed
        out.members.push_back(members);
        out.log += "changed lost=" + ranks_str(e.recovery().lost) + " step=" + std::to_string(e.recovery().step) +
                   (e.recovery().step_completed ? " completed" : " not completed") + ";";
      } catch (const ShardLostError& e) {
        out.log += std::string("shard lost: ") + e.what();
        std::lock_guard<std::mutex> lock(mu);
        res[static_cast<std::size_t>(me)] = out;
        return;
      } catch (const PeerLostError&) {
        try {
          auto r = zero.recover();
          world = r.group;
          out.log += "recovered lost=" + ranks_str(r.lost) + " step=" + std::to_string(r.step) +
                     (r.step_completed ? " completed" : " not completed") + ";";
        } catch (const ShardLostError& e) {
          out.log += std::string("shard lost: ") + e.what();
          std::lock_guard<std::mutex> lock(mu);
          res[static_cast<std::size_t>(me)] = out;
          return;
        }
      }
      (void)changed;
    }
    out.survived = true;
    out.final_size = world.size();
    for (const auto& p : params) out.params.push_back(p.to_vector<float>());
    std::lock_guard<std::mutex> lock(mu);
    res[static_cast<std::size_t>(me)] = std::move(out);
  };
  try {
    simulate(sc.n, fn, so);
  } catch (const Error& e) {
    if (std::string(e.what()).find("killed by the test") == std::string::npos) throw;
  }
  return res;
}

bool killed(const Scenario& sc, int r) {
  for (const auto& k : sc.kills)
    if (k.rank == r) return true;
  return false;
}

/// Every survivor: trained to the end, averaged over the expected members,
/// parameters bitwise the reference's.
/// Runs sc, in which a shard's every copy is lost: each rank of `ranks`
/// (under an INFO naming it and its log) failed with "shard lost: ", and
/// more(log) checks what its log names.
void check_shard_lost(const Scenario& sc, std::initializer_list<int> ranks,
                      const std::function<void(const std::string&)>& more) {
  const auto res = run(sc);
  for (int r : ranks) {
    const auto& log = res[static_cast<std::size_t>(r)].log;
    INFO("rank " << r << ": " << log);
    CHECK(log.find("shard lost: ") == 0);
    more(log);
  }
}

void check_bitwise(const Scenario& sc) {
  const auto res = run(sc);
  const auto ref = reference(sc);
  const auto members = expected_members(sc);
  for (int r = 0; r < sc.n; ++r) {
    if (killed(sc, r)) continue;
    const auto& x = res[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << x.log);
    REQUIRE(x.survived);
    CHECK(x.members == members);
    REQUIRE(x.params.size() == ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) {
      INFO("parameter " << i);
      CHECK(std::memcmp(x.params[i].data(), ref[i].data(), ref[i].size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("ZeRO redundancy: without a loss, buddies change nothing (bitwise the plain optimizer)", "[zero][survive]") {
  Scenario sc;
  sc.n = GENERATE(3, 5);
  sc.redundancy = GENERATE(1, 2);
  INFO(sc.n << " ranks, redundancy " << sc.redundancy);
  check_bitwise(sc);
}

TEST_CASE("ZeRO redundancy: a rank lost at each point of a step, the survivors finish bitwise the reference",
          "[zero][survive]") {
  const int n = GENERATE(3, 5);
  const std::string point = GENERATE(std::string("between"), std::string("begin"), std::string("computed"),
                                     std::string("broadcast0"), std::string("broadcast1"));
  Scenario sc;
  sc.n = n;
  Kill k{n == 3 ? 1 : 2, 2, point, 0};
  if (point.rfind("broadcast", 0) == 0) {
    k.point = "broadcast";
    k.index = point.back() - '0';
  }
  sc.kills = {k};
  INFO(n << " ranks, rank " << k.rank << " lost at step 2, point " << point);
  check_bitwise(sc);
}

TEST_CASE("ZeRO redundancy: two losses in a row", "[zero][survive]") {
  SECTION("5 ranks: rank 4 during the broadcasts of step 1, then rank 0 between steps 3 and 4") {
    check_bitwise({.n = 5, .kills = {{4, 1, "broadcast", 1}, {0, 3, "between", 0}}, .steps = 6});
  }
  SECTION("3 ranks down to 1: rank 2 after its local step 1, then rank 0 at the beginning of step 3") {
    check_bitwise({.n = 3, .kills = {{2, 1, "computed", 0}, {0, 3, "begin", 0}}});
  }
  SECTION("redundancy 2 at 5 ranks: ranks 1 and 2 (one's buddy) at once") {
    check_bitwise({.n = 5, .redundancy = 2, .kills = {{1, 2, "computed", 0}, {2, 2, "computed", 0}}});
  }
}

TEST_CASE("ZeRO redundancy: SGD with momentum, bucket view, the callback", "[zero][survive]") {
  Scenario sc;
  sc.n = 5;
  sc.spec = kMomentumSgd;
  sc.bucket_view = true;
  sc.callback = true;
  sc.kills = {{3, 2, "broadcast", 2}};
  check_bitwise(sc);
  const auto res = run(sc);
  CHECK(res[0].log == "callback lost=3 step=3;");
}

TEST_CASE("ZeRO redundancy: a rank lost with its buddy names the state that is gone", "[zero][survive]") {
  Scenario sc;
  sc.n = 5;
  sc.kills = {{1, 2, "computed", 0}, {2, 2, "computed", 0}};
  check_shard_lost(sc, {0, 3, 4}, [](const std::string& log) {
    CHECK(log.find("the optimizer state of rank 1's shard") != std::string::npos);
    CHECK(log.find("its buddies (rank(s) 2) were lost (redundancy 1)") != std::string::npos);
    CHECK(log.find("Fall back to the last checkpoint") != std::string::npos);
    CHECK(log.find("rank 2's shard") == std::string::npos);  // rank 2's own shard is with rank 3
  });
}

TEST_CASE("ZeRO redundancy: argument checks", "[zero][survive]") {
  std::mutex mu;
  std::vector<std::string> seen(2);
  simulate(2, [&](RankContext& ctx) {
    std::string out;
    auto ps = make_params();
    ZeroOptions zo{ctx.world()};
    zo.redundancy = -1;
    try {
      ZeroRedundancyOptimizer z(ps, OptimizerSpec{"SGD", {{"lr", 0.1}}}, zo);
    } catch (const ValueError& e) {
      out += "negative;";
    }
    zo.redundancy = 0;
    ZeroRedundancyOptimizer plain(ps, OptimizerSpec{"SGD", {{"lr", 0.1}}}, zo);
    try {
      plain.recover();
    } catch (const StateError& e) {
      out += "recover without redundancy;";
    }
    zo.redundancy = 3;
    ZeroRedundancyOptimizer z(make_params(), OptimizerSpec{"SGD", {{"lr", 0.1}}}, zo);
    out += "capped " + std::to_string(z.redundancy()) + " buddies of 0: " + ranks_str(z.buddies(0)) + ";";
    try {
      z.step([] { return 0.0; });
    } catch (const ValueError& e) {
      out += "closure;";
    }
    std::lock_guard<std::mutex> lock(mu);
    seen[static_cast<std::size_t>(ctx.rank())] = out;
  });
  for (const auto& s : seen)
    CHECK(s == "negative;recover without redundancy;capped 1 buddies of 0: 1;closure;");
}

// --- ZeroBuddyUpdate::replay ----------------------------------------------------------
// The buddies save the averaged gradients and get the owner's state every
// `interval` steps (at the end of steps interval-1, 2*interval-1, ...); at
// recovery the buddy replays the saved steps. The survivors must end bitwise
// where the reference (and the buddies that step every step) end, with an
// lr scheduler changing lr at every step.

TEST_CASE("ZeRO redundancy, replay: without a loss, bitwise the plain optimizer", "[zero][survive]") {
  Scenario sc;
  sc.n = GENERATE(3, 5);
  sc.redundancy = GENERATE(1, 2);
  sc.update = ZeroBuddyUpdate::replay;
  sc.interval = 2;
  sc.scheduler = true;
  INFO(sc.n << " ranks, redundancy " << sc.redundancy);
  check_bitwise(sc);
}

TEST_CASE("ZeRO redundancy, replay: a loss right after a snapshot and interval-1 steps after it, bitwise the reference",
          "[zero][survive]") {
  // interval 3: snapshots at the end of steps 2 and 5. Step 3 is the first
  // after the snapshot (one saved step to replay), step 5 the last before
  // the next (three, the snapshot of step 5 interrupted).
  const int n = GENERATE(3, 5);
  const std::int64_t step = GENERATE(3, 5);
  const std::string point = GENERATE(std::string("between"), std::string("begin"), std::string("computed"),
                                     std::string("broadcast1"), std::string("snapshot"));
  if (point == "snapshot" && step != 5) return;  // step 3 ends without one
  Scenario sc;
  sc.n = n;
  sc.steps = 8;
  sc.update = ZeroBuddyUpdate::replay;
  sc.interval = 3;
  sc.scheduler = true;
  Kill k{n == 3 ? 1 : 2, step, point, 0};
  if (point.rfind("broadcast", 0) == 0) {
    k.point = "broadcast";
    k.index = point.back() - '0';
  }
  sc.kills = {k};
  INFO(n << " ranks, rank " << k.rank << " lost at step " << step << ", point " << point);
  check_bitwise(sc);
}

TEST_CASE("ZeRO redundancy, replay: losses after the snapshot buffers are reused, bitwise the reference",
          "[zero][survive]") {
  // interval 2: snapshots at the end of steps 1, 3, 5, 7; from the third on
  // the buddies receive into the state tensors the one before replaced, and
  // the snapshot step saves no gradients unless its snapshot is dropped.
  // Lost: in the fourth snapshot (dropped: the copy replays from the third,
  // step 7 saved when its snapshot did not arrive), right after the third
  // (step 6, one saved step), and during the broadcasts of the third's step
  // (step 5: no snapshot; its gradients are saved on the way to the
  // recovery, which replays steps 4 and 5 from the second).
  const std::string where = GENERATE(std::string("snapshot 7"), std::string("computed 6"),
                                     std::string("broadcast 5"));
  Scenario sc;
  sc.n = 4;
  sc.steps = 9;
  sc.bucket_view = true;
  sc.update = ZeroBuddyUpdate::replay;
  sc.interval = 2;
  sc.scheduler = true;
  const std::int64_t step = where.back() - '0';
  const std::string point = where.substr(0, where.find(' '));
  sc.kills = {{2, step, point, point == "broadcast" ? 1 : 0}};
  INFO("rank 2 lost at " << where);
  check_bitwise(sc);
}

TEST_CASE("ZeRO redundancy, replay: two losses in a row, Adam and SGD with momentum, bucket view", "[zero][survive]") {
  constexpr auto replay = ZeroBuddyUpdate::replay;
  SECTION("5 ranks: rank 4 during the broadcasts of step 1, then rank 0 between steps 4 and 5") {
    check_bitwise({.n = 5, .kills = {{4, 1, "broadcast", 1}, {0, 4, "between", 0}}, .steps = 7, .update = replay,
                   .interval = 3, .scheduler = true});
  }
  SECTION("SGD with momentum, bucket view, the callback, interval 1 (a snapshot every step)") {
    check_bitwise({.n = 5, .kills = {{3, 2, "broadcast", 2}}, .spec = kMomentumSgd, .bucket_view = true,
                   .callback = true, .update = replay, .interval = 1});
  }
  SECTION("bucket view, two losses in a row (the buckets of moved parameters grow a row each time)") {
    check_bitwise({.n = 5, .kills = {{2, 1, "computed", 0}, {4, 4, "broadcast", 1}}, .steps = 7, .bucket_view = true,
                   .update = GENERATE(ZeroBuddyUpdate::step, ZeroBuddyUpdate::replay), .interval = 2});
  }
  SECTION("redundancy 2 at 5 ranks: ranks 1 and 2 (one's buddy) at once") {
    check_bitwise({.n = 5, .redundancy = 2, .kills = {{1, 2, "computed", 0}, {2, 2, "computed", 0}}, .update = replay,
                   .interval = 4});
  }
}

// --- buddies on other hosts ---------------------------------------------------------

namespace {

/// buddies(r) of every rank with this (fake) host map.
std::vector<std::vector<int>> buddy_table(const std::vector<std::string>& hosts, int k) {
  const int n = static_cast<int>(hosts.size());
  std::vector<std::vector<std::vector<int>>> seen(static_cast<std::size_t>(n));
  std::mutex mu;
  simulate(n, [&](RankContext& ctx) {
    ZeroOptions zo{ctx.world()};
    zo.redundancy = k;
    zo.hosts = hosts;
    ZeroRedundancyOptimizer z(make_params(), OptimizerSpec{"SGD", {{"lr", 0.1}}}, zo);
    std::vector<std::vector<int>> mine;
    for (int r = 0; r < n; ++r) mine.push_back(z.buddies(r));
    std::lock_guard<std::mutex> lock(mu);
    seen[static_cast<std::size_t>(ctx.rank())] = mine;
  });
  for (const auto& s : seen) CHECK(s == seen[0]);  // every rank computes the same table
  return seen[0];
}

}  // namespace

TEST_CASE("ZeRO redundancy: buddies on other hosts (fake host maps)", "[zero][survive]") {
  SECTION("2 hosts x 2 ranks: every buddy on the other host, each rank keeps one shard") {
    const std::vector<std::string> hosts = {"a", "a", "b", "b"};
    const auto t = buddy_table(hosts, 1);
    CHECK(t == std::vector<std::vector<int>>{{2}, {3}, {1}, {0}});
  }
  SECTION("3 hosts, uneven (3 + 1 + 1), redundancy 1 and 2") {
    const std::vector<std::string> hosts = {"a", "a", "a", "b", "c"};
    for (int k : {1, 2}) {
      INFO("redundancy " << k);
      const auto t = buddy_table(hosts, k);
      REQUIRE(t.size() == hosts.size());
      std::vector<int> load(hosts.size(), 0);
      for (std::size_t r = 0; r < t.size(); ++r) {
        REQUIRE(t[r].size() == static_cast<std::size_t>(k));
        for (int b : t[r]) {
          INFO("rank " << r << " buddy " << b);
          CHECK(b != static_cast<int>(r));
          CHECK(hosts[static_cast<std::size_t>(b)] != hosts[r]);  // another host is always there
          ++load[static_cast<std::size_t>(b)];
        }
        CHECK(std::set<int>(t[r].begin(), t[r].end()).size() == t[r].size());
      }
      // Ranks on the small hosts keep what the big host's ranks need
      // elsewhere; the big host's ranks keep the small hosts' shards.
      CHECK(load[3] + load[4] >= 3 * k);
    }
  }
  SECTION("one host: r+1, ..., r+k as before") {
    const auto t = buddy_table({"h", "h", "h", "h", "h"}, 2);
    CHECK(t == std::vector<std::vector<int>>{{1, 2}, {2, 3}, {3, 4}, {4, 0}, {0, 1}});
  }
}

TEST_CASE("ZeRO redundancy: a whole host lost (2 hosts x 2 ranks) loses no state", "[zero][survive]") {
  Scenario sc;
  sc.n = 4;
  sc.hosts = {"a", "a", "b", "b"};
  sc.update = GENERATE(ZeroBuddyUpdate::step, ZeroBuddyUpdate::replay);
  sc.interval = 2;
  sc.scheduler = true;
  sc.kills = {{0, 2, "computed", 0}, {1, 2, "computed", 0}};
  INFO("replay " << (sc.update == ZeroBuddyUpdate::replay));
  check_bitwise(sc);
}

// --- ZeroBuddyUpdate::host_memory ---------------------------------------------------
// The owner's bucket and state live in shared memory its buddies map; the
// owner journals its update in chunks of 1000 elements here (parameters of
// 257 to 70001 elements: one to 71 chunks). A rank lost anywhere, down to
// between writing a chunk and committing it ("chunk", index c: the c-th
// chunk of a parameter, the first parameter of its shard with that many), is
// rebuilt by its buddy bitwise.

TEST_CASE("ZeRO redundancy, host memory: without a loss, bitwise the plain optimizer", "[zero][survive]") {
  Scenario sc;
  sc.n = GENERATE(3, 5);
  sc.redundancy = GENERATE(1, 2);
  sc.bucket_view = true;
  sc.update = ZeroBuddyUpdate::host_memory;
  sc.scheduler = true;
  INFO(sc.n << " ranks, redundancy " << sc.redundancy);
  check_bitwise(sc);
}

namespace {

/// The rank that owns parameter i (of make_params()) over n ranks.
int owner_of(int n, std::size_t i) {
  int owner = -1;
  std::mutex mu;
  simulate(n, [&](RankContext& ctx) {
    ZeroRedundancyOptimizer z(make_params(), OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});
    std::lock_guard<std::mutex> lock(mu);
    owner = z.param_owners()[i];
  });
  return owner;
}

}  // namespace

TEST_CASE("ZeRO redundancy, host memory: a rank lost at each point of a step, bitwise the reference",
          "[zero][survive]") {
  const int n = GENERATE(3, 5);
  const std::string point = GENERATE(std::string("between"), std::string("begin"), std::string("chunk0"),
                                     std::string("chunk2"), std::string("chunk40"), std::string("computed"),
                                     std::string("broadcast0"), std::string("broadcast1"));
  Scenario sc;
  sc.n = n;
  sc.bucket_view = true;
  sc.update = ZeroBuddyUpdate::host_memory;
  sc.scheduler = true;
  Kill k{n == 3 ? 1 : 2, 2, point, 0};
  if (point.rfind("broadcast", 0) == 0) {
    k.point = "broadcast";
    k.index = point.back() - '0';
  }
  if (point.rfind("chunk", 0) == 0) {
    // The owner of parameter 7 (70001 elements, 71 chunks): chunk c is
    // reached in the first parameter of its shard that has c + 1 chunks.
    k.rank = owner_of(n, 7);
    k.point = "chunk";
    k.index = std::stoi(point.substr(5));
  }
  sc.kills = {k};
  INFO(n << " ranks, rank " << k.rank << " lost at step 2, point " << point);
  check_bitwise(sc);
}

TEST_CASE("ZeRO redundancy, host memory: state made inside the update, scalar state, two losses in a row",
          "[zero][survive]") {
  constexpr auto host_memory = ZeroBuddyUpdate::host_memory;
  SECTION("SGD with momentum lost in its first step (the momentum buffer is made by the update), or later") {
    // A parameter's first step is not journaled: it runs whole, its state
    // goes into shared memory after; "chunk" 0 then comes between the two.
    const std::int64_t step = GENERATE(0, 2);
    INFO("step " << step);
    check_bitwise({.n = 3, .kills = {{owner_of(3, 7), step, "chunk", step == 0 ? 0 : 1}}, .spec = kMomentumSgd,
                   .bucket_view = true, .update = host_memory});
  }
  SECTION("lost while committing a parameter: its first step (3 ranks) or a later one (5)") {
    const std::int64_t step = GENERATE(0, 2);
    INFO("step " << step);
    check_bitwise({.n = step == 0 ? 3 : 5, .kills = {{1, step, "committing", 0}}, .bucket_view = true,
                   .update = host_memory});
  }
  SECTION("NAdam (mu_product) lost in a chunk, the callback") {
    check_bitwise({.n = 5, .kills = {{owner_of(5, 7), 2, "chunk", 2}}, .spec = OptimizerSpec{"NAdam", {{"lr", 0.01}}},
                   .bucket_view = true, .callback = true, .update = host_memory});
  }
  SECTION("5 ranks: the owner of the largest parameter in a chunk of step 1, then another during the broadcasts "
          "of step 3") {
    const int first = owner_of(5, 7);
    check_bitwise({.n = 5, .kills = {{first, 1, "chunk", 1}, {(first + 2) % 5, 3, "broadcast", 1}}, .steps = 6,
                   .bucket_view = true, .update = host_memory});
  }
  SECTION("ranks 1 and 2 (both map each other's segments) at once, redundancy 1 and 2") {
    check_bitwise({.n = 5, .redundancy = GENERATE(1, 2), .kills = {{1, 2, "chunk", 0}, {2, 2, "computed", 0}},
                   .bucket_view = true, .update = host_memory});
  }
  SECTION("two hosts (2 + 3 ranks): a rank of each lost at once; the other host's survivors get the state sent") {
    check_bitwise({.n = 5, .kills = {{1, 2, "chunk", 0}, {3, 2, "broadcast", 1}}, .bucket_view = true,
                   .update = host_memory, .hosts = {"a", "a", "b", "b", "b"}});
  }
}

TEST_CASE("ZeRO redundancy, host memory: a whole host lost names the state that is gone, argument checks",
          "[zero][survive]") {
  // Every rank of a host maps its host-mates' segments: hosts a (ranks 0, 1)
  // and b (2, 3, 4); both ranks of host a lost.
  Scenario sc;
  sc.n = 5;
  sc.bucket_view = true;
  sc.update = ZeroBuddyUpdate::host_memory;
  sc.hosts = {"a", "a", "b", "b", "b"};
  sc.kills = {{0, 2, "chunk", 0}, {1, 2, "computed", 0}};
  check_shard_lost(sc, {2, 3, 4}, [](const std::string& log) {
    CHECK(log.find("the optimizer state of rank 0's shard") != std::string::npos);
    CHECK(log.find("the optimizer state of rank 1's shard") != std::string::npos);
  });
  std::mutex mu;
  std::vector<std::string> seen(2);
  simulate(2, [&](RankContext& ctx) {
    std::string out;
    ZeroOptions zo{ctx.world()};
    zo.redundancy = 1;
    zo.buddy_update = ZeroBuddyUpdate::host_memory;
    try {
      ZeroRedundancyOptimizer z(make_params(), OptimizerSpec{"Adam", {{"lr", 0.1}}}, zo);
    } catch (const ValueError& e) {
      if (std::string(e.what()).find("parameters_as_bucket_view") != std::string::npos) out += "bucket view;";
    }
    zo.parameters_as_bucket_view = true;
    zo.hosts = {"a", "b"};
    try {
      ZeroRedundancyOptimizer z(make_params(), OptimizerSpec{"Adam", {{"lr", 0.1}}}, zo);
    } catch (const ValueError& e) {
      if (std::string(e.what()).find("alone on its host") != std::string::npos) out += "alone;";
    }
    zo.hosts = {};
    try {
      std::vector<Tensor> m = {Tensor::zeros({4, 4})};
      ZeroRedundancyOptimizer z(m, OptimizerSpec{"Muon", {{"lr", 0.02}}}, zo);
    } catch (const NotSupportedError& e) {
      out += "muon;";
    }
    ZeroRedundancyOptimizer z(make_params(), OptimizerSpec{"Adam", {{"lr", 0.1}}}, zo);
    out += "buddies of 0: " + ranks_str(z.buddies(0)) + ";";  // every other rank of its host
    // Threads of one process: the parameters are broadcast (the plane copies from the owner's tensors).
    out += z.reads_parameters_from_segments() ? "reads;" : "broadcasts;";
    std::lock_guard<std::mutex> lock(mu);
    seen[static_cast<std::size_t>(ctx.rank())] = out;
  });
  for (const auto& s : seen) CHECK(s == "bucket view;alone;muon;buddies of 0: 1;broadcasts;");
}

TEST_CASE("ZeRO redundancy, host memory: one note per host when the shards' memory gets 4 KiB pages",
          "[zero][survive][huge]") {
  // tests/huge_shm_namespace.sh runs this again with /dev/shm mounted
  // huge=always in a mount namespace of its own (DOPT_TEST_EXPECT_HUGE_SHM=1).
  std::mutex mu;
  std::vector<std::string> notes;
  auto old = set_notice_handler([&](const std::string& t) {
    std::lock_guard<std::mutex> lock(mu);
    if (t.find("4 KiB pages") != std::string::npos) notes.push_back(t);
  });
  simulate(4, [&](RankContext& ctx) {
    std::vector<Tensor> ps;
    for (int i = 0; i < 4; ++i) ps.push_back(Tensor::zeros({std::int64_t{1} << 21}));
    ZeroOptions zo{ctx.world()};
    zo.redundancy = 1;
    zo.buddy_update = ZeroBuddyUpdate::host_memory;
    zo.parameters_as_bucket_view = true;
    zo.hosts = {"a", "a", "b", "b"};
    ZeroRedundancyOptimizer z(ps, OptimizerSpec{"Adam", {{"lr", 0.1}}}, zo);
    for (auto& p : ps) p.set_grad(Tensor::full(p.shape(), 0.5));
    z.step();
  });
  set_notice_handler(old);
  const std::string mode = shm::dev_shm_huge_mode();
  INFO("/dev/shm huge=" << mode);
  if (const char* e = std::getenv("DOPT_TEST_EXPECT_HUGE_SHM"); e && std::string(e) == "1") {
    CHECK(notes.empty());
  } else if (mode == "never") {
    REQUIRE(notes.size() == 2);  // one per (fake) host: ranks 0 and 2
    std::set<std::string> who;
    for (const auto& t : notes) {
      who.insert(t.substr(0, t.find(']') + 1));
      CHECK(t.find("huge=never") != std::string::npos);
      CHECK(t.find("mount -o remount,huge=advise /dev/shm") != std::string::npos);
    }
    CHECK(who == std::set<std::string>{"ZeroRedundancyOptimizer [rank 0]", "ZeroRedundancyOptimizer [rank 2]"});
  }
}
