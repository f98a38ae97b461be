// dopt::rpc and DistributedOptimizer between real processes on loopback:
// tests/rpc_peer.cpp is one worker; every worker prints "ok R CHECKS" after
// its graceful shutdown. Launched through dopt-run and by hand. CTest label
// "multiprocess", 60 s timeout (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>

#include "processes.hpp"

namespace {

using namespace dopt::testing;

const PeerProgram kPeer{"rpc", {}};

// The victim died of SIGKILL and every other rank exited 0; what those printed, together.
std::string survivors_output(const std::vector<Done>& ds, int victim) {
  std::string all;
  check_victims_and_survivors(ds, {victim}, [&](int, const Done& d) {
    CHECK(d.ok());
    all += d.out;
  }, SIGKILL);
  return all;
}

}  // namespace

TEST_CASE("rpc multiprocess: DistributedOptimizer equals local optimizers bit for bit for every class (3 and 5 processes)",
          "[rpc][multiprocess]") {
  const int n = GENERATE(3, 5);
  INFO(n << " processes");
  // rank 0: 9 optimizer configurations (every class) x 4 steps x 4 parameters compared (3 checks each, + shutdown)
  const Done d = kPeer.through_dopt_run(n, {"parity"});
  INFO(d.out);
  REQUIRE(d.ok());
  require_all_ok(d.out, n, 1);
  CHECK(contains(d.out, "ok 0 433"));
}

TEST_CASE("rpc multiprocess: three trainers on two shared parameter servers lose no update", "[rpc][multiprocess]") {
  kPeer.require_ok_by_hand(5, {"concurrent"}, 1);
}

TEST_CASE("rpc multiprocess: deadlines, unknown functions, remote errors, duplicated requests", "[rpc][multiprocess]") {
  const Done d = kPeer.through_dopt_run(3, {"errors"});
  INFO(d.out);
  REQUIRE(d.ok());
  require_all_ok(d.out, 3, 1);
  CHECK(contains(d.out, "ok 0 7"));  // six checks + the graceful shutdown
}

TEST_CASE("rpc multiprocess: an RRef's value lives until its last holder process lets go", "[rpc][multiprocess]") {
  std::string all;
  for (const Done& d : kPeer.by_hand(3, {"lifetime"})) {
    CHECK(d.ok());
    all += d.out;
  }
  require_all_ok(all, 3, 1);
  CHECK(contains(all, "ok 0 7"));
}

TEST_CASE("rpc multiprocess: an owner SIGKILLed mid-step fails the trainer's step naming it", "[rpc][multiprocess]") {
  const int n = GENERATE(3, 4);
  INFO(n << " processes");
  const auto ds = kPeer.by_hand(n, {"kill"});
  const std::string all = survivors_output(ds, n - 1);
  INFO(all);
  CHECK(contains(all, "kill_failure PeerLostError"));
  CHECK(contains(all, "'owner" + std::to_string(n - 1) + "' (rank " + std::to_string(n - 1) + ")"));
  CHECK_FALSE(contains(all, "error "));
}

TEST_CASE("rpc multiprocess: DistributedOptimizer with redundancy: an owner SIGKILLed mid-step, its buddy takes over, "
          "the parameters end bitwise the reference", "[rpc][multiprocess][survive]") {
  const int n = GENERATE(3, 5);
  const std::string point = n == 3 ? "begin" : "mirrored";
  const int victim = n == 3 ? 2 : 3;
  INFO(n << " processes, owner " << victim << " killed at '" << point << "' of step 2");
  const auto ds = kPeer.by_hand(n, {"survive", point});
  const std::string all = survivors_output(ds, victim);
  INFO(all);
  // rank 0: the run, the count, every parameter bitwise (4 or 8), every owner not the victim, the shutdown
  CHECK(contains(all, n == 3 ? "ok 0 9" : "ok 0 15"));
  CHECK(contains(all, "survive_log changed lost=" + std::to_string(victim)));
  CHECK(contains(all, point == "mirrored" ? "completed;" : "needs="));
  CHECK_FALSE(contains(all, "error "));
}

TEST_CASE("rpc multiprocess: DistributedOptimizer grows back: a standby process takes a SIGKILLed owner's slot, "
          "then the slot's former holder is SIGKILLed, the parameters end bitwise the reference",
          "[rpc][multiprocess][survive][grow]") {
  const int n = GENERATE(4, 6);  // the trainer, 2 or 4 owners, one standby (the last rank)
  const int victim = n == 4 ? 2 : 3;
  const int holder = n == 4 ? 1 : 4;
  INFO(n << " processes, owner " << victim << " killed at the beginning of step 2, rank " << n - 1
         << " joins at step 4, owner " << holder << " killed before step 5");
  const auto ds = kPeer.by_hand(n, {"grow"});
  std::string all;
  check_victims_and_survivors(ds, {victim, holder}, [&](int, const Done& d) {
    CHECK(d.ok());
    all += d.out;
  }, SIGKILL);
  INFO(all);
  // rank 0: the run, the count, every parameter bitwise (4 or 8), no victim an owner (2 per owner), the shutdown
  CHECK(contains(all, n == 4 ? "ok 0 11" : "ok 0 19"));
  const std::string slot = std::to_string(2 * (victim - 1)) + "," + std::to_string(2 * victim - 1);
  CHECK(contains(all, "returned joined=" + std::to_string(n - 1) + " lost= moved=" + slot + " needs= step=4;"));
  CHECK(contains(all, n == 4 ? "owners_joined 1,3" : "owners_joined 1,2,5,4"));
  CHECK(contains(all, "changed lost=" + std::to_string(holder)));
  CHECK_FALSE(contains(all, "error "));
}
