// dopt::rpc under a fault plan's partition (rpc::simulate, deterministic): a
// call to a worker on the other side fails as one to a lost worker does
// (PeerLostError naming the function and the worker), after its deadline in
// virtual time; calls within a side go through; the report counts the lost
// messages; two runs of a seed are equal.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/actors/sim.hpp"

using namespace dopt;
using namespace dopt::rpc;
using Catch::Matchers::Contains;

namespace {

constexpr auto kCallTimeout = std::chrono::seconds(5);

/// Worker 2 apart from workers 0 and 1: every worker calls every other
/// (the far side with one retry); returns, per worker, what each call gave
/// ("worker1", or the error's text), in the order of the callees.
std::vector<std::vector<std::string>> calls_across(std::uint64_t seed, SimReport* rep, bool keep_trace = false) {
  static std::once_flag once;
  std::call_once(once, [] { register_function("t.part.name", [](Agent& a) { return a.name(); }); });
  rpc::SimulateOptions o;
  o.deterministic = true;
  o.seed = seed;
  o.report = rep;
  o.keep_trace = keep_trace;
  o.faults.partition({2});
  std::mutex m;
  std::vector<std::vector<std::string>> seen(3);
  rpc::simulate(3, [&](Agent& a) {
    std::vector<std::string> mine;
    for (int r = 0; r < 3; ++r) {
      if (r == a.rank()) continue;
      try {
        mine.push_back(a.rpc_sync<std::string>(r, Fn("t.part.name", {.timeout = kCallTimeout, .retries = 1})));
      } catch (const PeerLostError& e) {
        mine.push_back(std::string("PeerLostError: ") + e.what());
      } catch (const std::exception& e) {
        mine.push_back(std::string("other: ") + e.what());
      }
    }
    std::lock_guard<std::mutex> lock(m);
    seen[static_cast<std::size_t>(a.rank())] = std::move(mine);
  }, o);
  return seen;
}

}  // namespace

TEST_CASE("rpc partition: a call to the other side fails as to a lost worker in virtual time, within a side it works",
          "[sim][rpc]") {
  SimReport rep;
  const auto t0 = std::chrono::steady_clock::now();
  const auto seen = calls_across(4, &rep);
  CHECK(std::chrono::steady_clock::now() - t0 < kCallTimeout);  // virtual time, no hang
  CHECK(rep.virtual_time >= 2 * kCallTimeout);                  // both attempts waited out
  REQUIRE(seen[0].size() == 2u);
  REQUIRE(seen[1].size() == 2u);
  REQUIRE(seen[2].size() == 2u);
  CHECK(seen[0][0] == "worker1");
  CHECK(seen[1][0] == "worker0");
  for (const auto& e : {seen[0][1], seen[1][1]})
    CHECK_THAT(e, Contains("PeerLostError") && Contains("t.part.name") && Contains("worker2") && Contains("partition"));
  CHECK_THAT(seen[2][0], Contains("PeerLostError") && Contains("t.part.name") && Contains("worker0"));
  CHECK_THAT(seen[2][1], Contains("PeerLostError") && Contains("t.part.name") && Contains("worker1"));
  // The requests of the 4 calls across (and any later message across): lost, counted and named.
  CHECK(rep.fired.partitioned >= 4u);
  bool named = false;
  for (const auto& f : rep.faults) named = named || (f.find("rpc request") != std::string::npos && f.find("partition") != std::string::npos);
  CHECK(named);
}

TEST_CASE("rpc partition: two runs of a seed have equal traces", "[sim][rpc]") {
  SimReport a, b;
  const auto first = calls_across(11, &a, true);
  const auto second = calls_across(11, &b, true);
  CHECK(first == second);
  CHECK(sim::compare_traces(a, b) == "");
  CHECK(a.fired == b.fired);
}
