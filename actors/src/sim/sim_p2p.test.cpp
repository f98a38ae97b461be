// send and recv under the deterministic scheduler's fault plan: late sends
// (virtual time, reordering between tags, one tag in order), lost sends as
// lost links, partitions, the counts of the run report, and a planted
// ordering bug that only the fault plan brings out. Rank functions record;
// assertions run after simulate() returned.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/sim.hpp"
#include "dopt/actors/simulate.hpp"
#include "sim/sim_test_options.hpp"

using namespace dopt;
using Catch::Matchers::Contains;

namespace {

SimulateOptions p2p_det(std::uint64_t seed, SimReport* rep = nullptr) {
  return sim_test::deterministic(seed, rep, std::chrono::seconds(30));
}

/// Rank 1 sends a header (tag 1) and then a payload (tag 2), both async;
/// rank 0 handles whichever arrives first as the header. The planted bug:
/// nothing orders two tags, a late header lets the payload through first.
void header_then_payload(const SimulateOptions& o) {
  std::string wrong;
  simulate(2, [&](RankContext& ctx) {
    auto& pg = ctx.world();
    if (ctx.rank() == 1) {
      auto h = pg.send_async(Tensor::full({1}, 1.0, DType::float64), 0, 1);
      auto p = pg.send_async(Tensor::full({4}, 2.0, DType::float64), 0, 2);
      h.get();
      p.get();
      return;
    }
    Tensor header = Tensor::zeros({1}, DType::float64), payload = Tensor::zeros({4}, DType::float64);
    auto h = pg.recv_async(header, 1, 1);
    auto p = pg.recv_async(payload, 1, 2);
    // The polling loop: the first message to arrive is taken for the header.
    for (;;) {
      if (h.wait_for(std::chrono::milliseconds(1))) break;
      if (p.is_ready()) {
        wrong = "the payload arrived before the header and was taken for it";
        break;
      }
    }
    h.get();
    p.get();
  }, o);
  if (!wrong.empty()) throw std::runtime_error(wrong);
}

FaultPlan late_sends() {
  FaultPlan f;
  f.delay_messages(-1, 0.5, std::chrono::milliseconds(50));
  return f;
}

}  // namespace

TEST_CASE("p2p fault plan: late sends take virtual time, are counted, and deliver the same data", "[sim][p2p]") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    SimReport rep;
    auto o = p2p_det(seed, &rep);
    o.faults = late_sends();
    std::vector<double> got(3, -1);
    simulate(3, [&](RankContext& ctx) {
      auto& pg = ctx.world();
      if (ctx.rank() == 0) {
        for (int k = 1; k < 3; ++k)
          for (int i = 0; i < 4; ++i) pg.send(Tensor::full({2}, 10.0 * k + i, DType::float64), k, 5);
      } else {
        for (int i = 0; i < 4; ++i) {
          Tensor t = Tensor::zeros({2}, DType::float64);
          pg.recv(t, 0, 5);
          got[static_cast<std::size_t>(ctx.rank())] = t.to_vector<double>()[0];
        }
      }
    }, o);
    INFO("seed " << seed << ": " << sim::describe(rep.fired));
    CHECK(got[1] == 13.0);
    CHECK(got[2] == 23.0);
    CHECK(rep.fired.p2p_delays > 0);
    CHECK(rep.fired.total() >= rep.fired.p2p_delays);
    CHECK(rep.virtual_time > std::chrono::milliseconds(0));
    CHECK_THAT(sim::describe(rep.fired), Contains("p2p delay"));
  }
}

TEST_CASE("p2p fault plan: the sends of one tag arrive in order, late or not", "[sim][p2p]") {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    auto o = p2p_det(seed);
    o.faults = late_sends();
    std::vector<int> order;
    simulate(2, [&](RankContext& ctx) {
      auto& pg = ctx.world();
      if (ctx.rank() == 1) {
        std::vector<Future<void>> sends;
        for (int i = 0; i < 5; ++i) sends.push_back(pg.send_async(Tensor::full({1}, 1.0 * i), 0, 3));
        for (auto& f : sends) f.get();
        return;
      }
      std::vector<Tensor> ts;
      std::vector<Future<void>> recvs;
      for (int i = 0; i < 5; ++i) ts.push_back(Tensor::zeros({1}));
      for (int i = 0; i < 5; ++i) recvs.push_back(pg.recv_async(ts[static_cast<std::size_t>(i)], 1, 3));
      std::vector<bool> seen(5, false);
      while (order.size() < 5) {
        recvs[order.size()].wait_for(std::chrono::milliseconds(1));
        for (int i = 0; i < 5; ++i)
          if (!seen[static_cast<std::size_t>(i)] && recvs[static_cast<std::size_t>(i)].is_ready()) {
            seen[static_cast<std::size_t>(i)] = true;
            order.push_back(static_cast<int>(ts[static_cast<std::size_t>(i)].to_vector<float>()[0]));
          }
      }
    }, o);
    INFO("seed " << seed);
    CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
  }
}

TEST_CASE("p2p fault plan: a dropped send is a lost link, both calls fail with PeerLostError in virtual time",
          "[sim][p2p]") {
  SimReport rep;
  auto o = p2p_det(3, &rep);
  o.faults.drop_message(1, 1);  // rank 1's first message: its send
  std::mutex m;
  std::vector<std::string> errors(2);
  const auto t0 = std::chrono::steady_clock::now();
  simulate(2, [&](RankContext& ctx) {
    try {
      if (ctx.rank() == 1) ctx.world().send(Tensor::full({3}, 1.0), 0, 9);
      else ctx.world().recv(Tensor::zeros({3}), 1, 9);
    } catch (const PeerLostError& e) {
      std::lock_guard<std::mutex> lock(m);
      errors[static_cast<std::size_t>(ctx.rank())] = e.what();
    }
  }, o);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // virtual time
  CHECK(rep.virtual_time >= std::chrono::seconds(30));
  CHECK_THAT(errors[0], Contains("recv") && Contains("link from rank 1 to rank 0") && Contains("dropped"));
  CHECK_THAT(errors[1], Contains("send") && Contains("link from rank 1 to rank 0") && Contains("30000 ms"));
  CHECK(rep.fired.p2p_drops == 1);
  REQUIRE(rep.faults.size() == 1);
  CHECK_THAT(rep.faults[0], Contains("dropped"));
}

TEST_CASE("p2p fault plan: a partition cuts the sends between its sides, not within them", "[sim][p2p]") {
  SimReport rep;
  auto o = p2p_det(5, &rep);
  o.faults.partition({0});  // rank 0 apart from ranks 1 and 2
  std::mutex m;
  std::vector<std::string> outcome(3);
  simulate(3, [&](RankContext& ctx) {
    auto& pg = ctx.world();
    std::string what = "ok";
    try {
      if (ctx.rank() == 1) {
        pg.send(Tensor::full({1}, 7.0), 2, 0);  // same side
        pg.send(Tensor::full({1}, 8.0), 0, 0);  // across
      } else if (ctx.rank() == 2) {
        pg.recv(Tensor::zeros({1}), 1, 0);
      } else {
        pg.recv(Tensor::zeros({1}), 1, 0);
      }
    } catch (const PeerLostError& e) {
      what = e.what();
    }
    std::lock_guard<std::mutex> lock(m);
    outcome[static_cast<std::size_t>(ctx.rank())] = what;
  }, o);
  CHECK(outcome[2] == "ok");
  CHECK_THAT(outcome[0], Contains("partition") && Contains("recv"));
  CHECK_THAT(outcome[1], Contains("partition") && Contains("send"));
  CHECK(rep.fired.partitioned == 1);
}

TEST_CASE("p2p planted ordering bug: the swarm finds it with late sends, its seed replays it, never without faults",
          "[sim][p2p]") {
  const sim::SwarmOptions swarm = sim_test::quiet_swarm(40);
  // Without faults no schedule lets the payload overtake the header.
  const auto clean = sim::swarm(header_then_payload, swarm);
  CHECK_FALSE(clean.failing_seed);
  CHECK(clean.tried == 40);
  SimulateOptions base;
  base.faults = late_sends();
  base.timeout = std::chrono::seconds(30);
  const auto found = sim::swarm(header_then_payload, swarm, base);
  REQUIRE(found.failing_seed);
  CHECK_FALSE(found.nondeterministic);
  CHECK_THAT(found.failure, Contains("payload arrived before the header"));
  // Its seed fails the same way, with the same trace, run after run.
  SimReport a, b;
  for (SimReport* rep : {&a, &b}) {
    SimulateOptions o = base;
    o.deterministic = true;
    o.seed = *found.failing_seed;
    o.report = rep;
    o.keep_trace = true;
    CHECK_THROWS_WITH(header_then_payload(o), Contains("payload arrived before the header"));
  }
  CHECK(sim::compare_traces(a, b) == "");
  CHECK(a.fired.p2p_delays > 0);
  // Replay through DOPT_SIM_SEED: the swarm runs only that seed, and it fails again.
  ::setenv("DOPT_SIM_SEED", std::to_string(*found.failing_seed).c_str(), 1);
  const auto again = sim::swarm(header_then_payload, swarm, base);
  ::unsetenv("DOPT_SIM_SEED");
  CHECK(again.tried == 1);
  CHECK(again.failure == found.failure);
}

TEST_CASE("p2p fault plan: two runs of a seed with late and lost sends have equal traces", "[sim][p2p]") {
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    SimReport a, b;
    for (SimReport* rep : {&a, &b}) {
      auto o = p2p_det(seed, rep);
      o.keep_trace = true;
      o.faults = late_sends();
      o.faults.drop_message(2, 3);
      simulate(3, [&](RankContext& ctx) {
        auto& pg = ctx.world();
        const int r = ctx.rank();
        try {
          for (int i = 0; i < 3; ++i) {
            auto s = pg.send_async(Tensor::full({2}, 1.0 * r), (r + 1) % 3, i);
            pg.recv(Tensor::zeros({2}), (r + 2) % 3, i);
            s.get();
          }
        } catch (const PeerLostError&) {
          // the link from rank 2 to rank 0 is lost
        }
      }, o);
    }
    INFO("seed " << seed);
    CHECK(sim::compare_traces(a, b) == "");
    CHECK(a.trace == b.trace);
    CHECK(a.fired == b.fired);
    CHECK(a.fired.p2p_drops >= 1);
  }
}

TEST_CASE("fault plans as text: sim::parse_faults, and DOPT_SIM_FAULTS added to every deterministic run",
          "[sim][p2p]") {
  const FaultPlan p = sim::parse_faults("delay:-1:0.5:50; drop:1:3;partition:0,2@100;crash:2:0;stop:1:4;fail_read:ckpt");
  REQUIRE(p.faults.size() == 6);
  CHECK(p.faults[0].kind == FaultPlan::Kind::delay);
  CHECK(p.faults[0].rank == -1);
  CHECK(p.faults[0].probability == 0.5);
  CHECK(p.faults[0].delay == std::chrono::milliseconds(50));
  CHECK(p.faults[1].kind == FaultPlan::Kind::drop);
  CHECK(p.faults[1].at == 3);
  CHECK(p.faults[2].side == std::vector<int>{0, 2});
  CHECK(p.faults[2].from == std::chrono::milliseconds(100));
  CHECK(p.faults[3].kind == FaultPlan::Kind::crash);
  CHECK(p.faults[4].kind == FaultPlan::Kind::stop);
  CHECK(p.faults[5].path == "ckpt");
  CHECK(sim::parse_faults("").empty());
  CHECK_THROWS_WITH(sim::parse_faults("delay:1:0.5"), Contains("delay:RANK:PROBABILITY:MS"));
  CHECK_THROWS_WITH(sim::parse_faults("drop:x:1"), Contains("not an integer"));
  CHECK_THROWS_WITH(sim::parse_faults("flood:1"), Contains("unknown kind 'flood'"));
  // The environment's plan joins the options' one: the planted race shows with no plan in the code.
  ::setenv("DOPT_SIM_FAULTS", "delay:-1:0.5:50", 1);
  const auto found = sim::swarm(header_then_payload, sim_test::quiet_swarm(40));
  ::unsetenv("DOPT_SIM_FAULTS");
  CHECK(found.failing_seed);
  CHECK_FALSE(sim::env_faults());
}

TEST_CASE("fault plans that cannot mean anything are a ValueError naming the fault, and DOPT_SIM_FAULTS needs "
          "DOPT_SIM_SEED",
          "[sim][p2p]") {
  const auto run = [](const std::string& spec) {
    auto o = sim_test::deterministic(1, nullptr, std::chrono::seconds(5));
    o.faults = sim::parse_faults(spec);
    simulate(3, [](RankContext& ctx) { ctx.world().barrier(); }, o);
  };
  CHECK_NOTHROW(run("delay:-1:0.5:50;crash:1:9;stop:2:9;partition:0@100000"));  // none fires
  CHECK_THROWS_WITH(run("delay:-1:2:50"), Contains("probability must be within 0 and 1, got 2"));
  CHECK_THROWS_WITH(run("delay:-1:-0.5:50"), Contains("probability must be within 0 and 1"));
  CHECK_THROWS_WITH(run("delay:-1:0.5:-50"), Contains("delay's most must be >= 0 ms, got -50"));
  CHECK_THROWS_WITH(run("delay:3:0.5:5"), Contains("delay names rank 3 of a world of 3"));
  CHECK_THROWS_WITH(run("crash:1:-5"), Contains("crash of rank 1 at number -5"));
  CHECK_THROWS_WITH(run("crash:0:1;crash:0:2"), Contains("two crash faults for rank 0"));
  CHECK_THROWS_WITH(run("partition:0,1,2"), Contains("must leave ranks on both sides, got 3 rank(s) of a world of 3"));
  CHECK_THROWS_WITH(run("partition:1@-3"), Contains("a partition's start must be >= 0 ms, got -3"));
  CHECK_THROWS_AS(run("crash:0:1;crash:0:2"), ValueError);
  // Faults in the environment of a run that is not deterministic would do nothing: refused.
  ::setenv("DOPT_SIM_FAULTS", "delay:-1:0.5:50", 1);
  SimulateOptions threaded;
  CHECK_THROWS_WITH(simulate(2, [](RankContext&) {}, threaded), Contains("DOPT_SIM_FAULTS is set but this run is not "
                                                                         "deterministic: set DOPT_SIM_SEED too"));
  ::unsetenv("DOPT_SIM_FAULTS");
}
