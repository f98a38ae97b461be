// Collectives under a fault plan's partition (deterministic simulation): a
// collective whose group spans the partition fails on every rank with
// PeerLostError naming a rank of the other side, after the group's virtual
// timeout; a subgroup inside one side is unaffected; two runs of a seed are
// equal. Rank functions record; assertions run after simulate() returned.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/sim.hpp"
#include "dopt/actors/simulate.hpp"
#include "sim/sim_test_options.hpp"

using namespace dopt;
using Catch::Matchers::Contains;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);
constexpr auto kFrom = std::chrono::milliseconds(100);

struct Outcome {
  double side_sum = 0;    // the all_reduce of the rank's own side
  std::string world;      // the world all_reduce: "ok" or its PeerLostError
};

/// Ranks [0, n / 2) apart from the rest from virtual time kFrom on: each
/// side's subgroup (made before) all-reduces, then the world all-reduces.
std::vector<Outcome> split_world(int n, std::uint64_t seed, SimReport* rep, bool keep_trace = false) {
  auto o = sim_test::deterministic(seed, rep, kTimeout);
  o.keep_trace = keep_trace;
  std::vector<int> low, high;
  for (int r = 0; r < n; ++r) (r < n / 2 ? low : high).push_back(r);
  o.faults.partition(low, kFrom);
  std::mutex m;
  std::vector<Outcome> out(static_cast<std::size_t>(n));
  simulate(n, [&](RankContext& ctx) {
    auto& pg = ctx.world();
    const int r = ctx.rank();
    auto low_group = pg.new_group(low);
    auto high_group = pg.new_group(high);
    Promise<void> never;
    (void)never.get_future().wait_for(2 * kFrom);  // virtual time passes the partition's start
    Outcome got;
    Tensor t = Tensor::full({1}, 1.0 + r, DType::float64);
    (r < n / 2 ? low_group : high_group).all_reduce(t);
    got.side_sum = t.to_vector<double>()[0];
    got.world = "ok";
    try {
      Tensor w = Tensor::full({1}, 1.0, DType::float64);
      pg.all_reduce(w);
    } catch (const PeerLostError& e) {
      got.world = e.what();
    }
    std::lock_guard<std::mutex> lock(m);
    out[static_cast<std::size_t>(r)] = got;
  }, o);
  return out;
}

}  // namespace

TEST_CASE("partition: a collective across it fails on every rank naming the other side, one inside a side works",
          "[sim][partition]") {
  for (int n : {3, 5}) {
    SimReport rep;
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = split_world(n, 7, &rep);
    INFO("world size " << n);
    CHECK(std::chrono::steady_clock::now() - t0 < kTimeout / 2);  // virtual time, no hang
    CHECK(rep.virtual_time >= kTimeout + 2 * kFrom);
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      const auto& got = out[static_cast<std::size_t>(r)];
      double want = 0;
      for (int q = 0; q < n; ++q)
        if ((q < n / 2) == (r < n / 2)) want += 1.0 + q;
      CHECK(got.side_sum == want);
      CHECK_THAT(got.world, Contains("was lost") && Contains("partition") && Contains("all_reduce"));
      // The rank it names is on the other side.
      bool names_other = false;
      for (int q = 0; q < n; ++q)
        if ((q < n / 2) != (r < n / 2) && got.world.find("rank " + std::to_string(q) + " was lost") != std::string::npos)
          names_other = true;
      CHECK(names_other);
    }
    CHECK(rep.fired.partitioned == static_cast<std::uint64_t>(n));  // one lost collective per rank
    CHECK_FALSE(rep.faults.empty());
  }
}

TEST_CASE("partition: two runs of a seed with a partition have equal traces", "[sim][partition]") {
  for (std::uint64_t seed : {1u, 2u}) {
    SimReport a, b;
    (void)split_world(3, seed, &a, true);
    (void)split_world(3, seed, &b, true);
    INFO("seed " << seed);
    CHECK(sim::compare_traces(a, b) == "");
    CHECK(a.trace == b.trace);
    CHECK(a.fired == b.fired);
    CHECK(a.fired.partitioned > 0);
  }
}
