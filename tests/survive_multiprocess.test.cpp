// Losing a rank and going on, between real processes: tests/survive_peer.cpp
// is one rank; the lost one kills itself (SIGKILL) at a point of the run,
// the others recover and check their results bitwise against a reference
// they compute themselves ("ok R CHECKS"). By hand (environment set here) and
// through dopt-run --on-failure continue. CTest label "multiprocess", 60 s
// timeout (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <string>

#include "processes.hpp"

namespace {

using namespace dopt::testing;

const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";
const std::string kPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_survive_peer";
const std::string kReplicatedPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_survive_replicated_peer";
const std::map<std::string, std::string> kEnv{{"DOPT_TIMEOUT_MS", "30000"}};

/// Runs n ranks by hand; `victims` must die of SIGKILL, the others print "ok".
void survivors_ok(int n, const std::vector<std::string>& args, const std::vector<int>& victims, long min_checks,
                  const std::string& peer = kPeer) {
  const auto ds = run_ranks_by_hand(peer, n, args, kEnv);
  std::string all;
  int oks = 0;
  check_victims_and_survivors(ds, victims, [&](int r, const Done& d) {
    CHECK(d.ok());
    CHECK_FALSE(contains(d.out, "error "));
    const std::string tag = "ok " + std::to_string(r) + " ";
    const auto at = d.out.find(tag);
    REQUIRE(at != std::string::npos);
    CHECK(std::stol(d.out.substr(at + tag.size())) >= min_checks);
    ++oks;
  }, SIGKILL);
  CHECK(oks == n - static_cast<int>(victims.size()));
  CHECK(shm_left_by(ds).empty());
}

}  // namespace

TEST_CASE("survive multiprocess: the survivors of a killed process shrink the world and use it (3, 5)",
          "[survive][multiprocess]") {
  const int n = GENERATE(3, 5);
  INFO(n << " processes");
  survivors_ok(n, {"shrink", "1"}, {1}, 5);
}

TEST_CASE("survive multiprocess: ZeRO with redundancy, a process killed at each point of a step (3, 5)",
          "[survive][multiprocess]") {
  const int n = GENERATE(3, 5);
  const std::string kill = GENERATE(std::string("2:2:between"), std::string("2:2:begin"), std::string("2:2:computed"),
                                    std::string("2:2:broadcast:0"), std::string("2:2:broadcast:1"));
  INFO(n << " processes, kill " << kill);
  survivors_ok(n, {"zero", kill}, {2}, 25);
}

TEST_CASE("survive multiprocess: ZeRO with host-memory redundancy, a process killed anywhere in a step (3, 5)",
          "[survive][multiprocess]") {
  // "timer": SIGKILL from a thread some microseconds into the local step,
  // wherever the kernels are then (the pre-images of the chunk in flight
  // are saved line by line); "chunk:0": a chunk written, not committed.
  const int n = GENERATE(3, 5);
  const std::string kill =
      GENERATE(std::string("2:2:begin"), std::string("2:2:chunk:0"), std::string("2:2:timer:20"),
               std::string("2:2:timer:80"), std::string("2:2:timer:200"), std::string("2:2:computed"),
               std::string("2:2:broadcast:1"));
  INFO(n << " processes, kill " << kill);
  survivors_ok(n, {"zero-host-memory", kill}, {2}, 25);
}

TEST_CASE("survive multiprocess: PostLocalSGDOptimizer, a process killed before, during, after the averaging (3, 5)",
          "[survive][multiprocess][post_local_sgd]") {
  const int n = GENERATE(3, 5);
  const std::string kill = GENERATE(std::string("1:3:before"), std::string("1:3:during"), std::string("1:3:after"));
  INFO(n << " processes, kill " << kill);
  survivors_ok(n, {"plsgd", kill}, {1}, 12, kReplicatedPeer);
}

TEST_CASE("survive multiprocess: Reducer, a process killed before, during, after the bucket reduce (3, 5)",
          "[survive][multiprocess][reducer]") {
  const int n = GENERATE(3, 5);
  const std::string kill = GENERATE(std::string("2:2:before"), std::string("2:2:during"), std::string("2:2:after"));
  INFO(n << " processes, kill " << kill);
  survivors_ok(n, {"reducer", kill, "callback"}, {2}, 12, kReplicatedPeer);
}

TEST_CASE("survive multiprocess: two losses in a row (5 processes)", "[survive][multiprocess]") {
  survivors_ok(5, {"zero", "4:1:broadcast:1", "0:3:between"}, {0, 4}, 25);
}

TEST_CASE("survive multiprocess: a process lost with its buddy: every survivor names the state that is gone (3, 5)",
          "[survive][multiprocess]") {
  // Rank 1's buddy is rank 2 (one host: r + 1); both die after their local
  // step of step 2, so rank 1's shard has no copy left. Rank 2's own shard is
  // with rank 3 (3 processes: rank 0), which survives.
  const int n = GENERATE(3, 5);
  INFO(n << " processes");
  const auto ds = run_ranks_by_hand(kPeer, n, {"zero", "1:2:computed", "2:2:computed"}, kEnv);
  check_victims_and_survivors(ds, {1, 2}, [](int, const Done& d) {
    REQUIRE(WIFEXITED(d.status));
    CHECK(WEXITSTATUS(d.status) == 1);
    CHECK(contains(d.out, "error StateError: "));
    CHECK(contains(d.out, "the optimizer state of rank 1's shard"));
    CHECK(contains(d.out, "its buddies (rank(s) 2) were lost (redundancy 1)"));
    CHECK(contains(d.out, "Fall back to the last checkpoint"));
    CHECK_FALSE(contains(d.out, "rank 2's shard"));
  }, SIGKILL);
  CHECK(shm_left_by(ds).empty());
}

TEST_CASE("survive multiprocess: dopt-run --on-failure continue lets the survivors finish (3, 5)",
          "[survive][multiprocess]") {
  const int n = GENERATE(3, 5);
  INFO(n << " processes");
  const Done d = wait(start({kDoptRun, "--on-failure", "continue", "--nproc-per-node", std::to_string(n),
                             "--master-port", "0", kPeer, "zero", "1:2:broadcast:0"},
                            kEnv));
  INFO(d.out);
  CHECK(d.ok());
  CHECK(contains(d.out, "dopt-run: rank 1 killed by signal 9 (SIGKILL); the other ranks continue (--on-failure continue)"));
  CHECK(contains(d.out, "dopt-run: 1 rank(s) failed (1), " + std::to_string(n - 1) + " finished"));
  for (int r = 0; r < n; ++r)
    if (r != 1) CHECK(contains(d.out, "[rank " + std::to_string(r) + "] ok " + std::to_string(r) + " "));
  CHECK_FALSE(contains(d.out, "error "));
}

TEST_CASE("survive multiprocess: without --on-failure continue, dopt-run stops the others as before",
          "[survive][multiprocess]") {
  const Done d = wait(start({kDoptRun, "--nproc-per-node", "3", "--master-port", "0", kPeer, "zero", "1:2:begin"}, kEnv));
  INFO(d.out);
  CHECK(WEXITSTATUS(d.status) == 128 + SIGKILL);
  CHECK(contains(d.out, "dopt-run: rank 1 killed by signal 9 (SIGKILL)"));
  CHECK(contains(d.out, "stopping the other ranks"));
}

TEST_CASE("survive multiprocess: on the hierarchical plane (2 hosts x 2 processes), survivors on both hosts recover",
          "[survive][multiprocess]") {
  // Each "host" is a DOPT_HOST_ID of its own on this machine.
  const std::vector<std::string> args = GENERATE(std::vector<std::string>{"shrink", "1"},
                                                 std::vector<std::string>{"zero", "2:2:broadcast:1"},
                                                 std::vector<std::string>{"zero", "1:2:between"});
  const int victim = std::stoi(args[1].substr(0, 1));
  INFO(args[0] << " " << args[1]);
  const int port = free_port();
  std::vector<Proc> ps;
  for (int r = 0; r < 4; ++r) {
    auto e = rank_env(r, 4, port);
    e["LOCAL_RANK"] = std::to_string(r % 2);
    e["LOCAL_WORLD_SIZE"] = "2";
    e["DOPT_HOST_ID"] = "host" + std::to_string(r / 2);
    e["DOPT_DEBUG"] = "1";
    e.insert(kEnv.begin(), kEnv.end());
    std::vector<std::string> argv{kPeer};
    argv.insert(argv.end(), args.begin(), args.end());
    ps.push_back(start(argv, e));
  }
  for (int r = 0; r < 4; ++r) {
    const Done d = wait(ps[static_cast<std::size_t>(r)]);
    INFO("rank " << r << ": " << d.out);
    CHECK(contains(d.out, "runs on the hier plane"));
    if (r == victim) {
      CHECK(WIFSIGNALED(d.status));
      continue;
    }
    CHECK(d.ok());
    CHECK(contains(d.out, "ok " + std::to_string(r) + " "));
  }
}
