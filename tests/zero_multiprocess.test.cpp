// ZeroRedundancyOptimizer and Join between real processes: tests/zero_peer.cpp
// is one rank; it checks its parameters and state bitwise against a plain
// local optimizer it runs itself on independently averaged gradients and
// prints "ok R CHECKS". Launched through dopt-run and by hand (environment set
// here). CTest label "multiprocess", 60 s timeout (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "processes.hpp"

namespace {

using namespace dopt::testing;
namespace fs = std::filesystem;

const PeerProgram kPeer{"zero", {{"DOPT_TIMEOUT_MS", "30000"}}};

// Checks per rank the scenarios make at least (each step compares every
// parameter and every averaged gradient).
constexpr long kParityChecks = 500;
constexpr long kCkptChecks = 200;
constexpr long kJoinChecks = 200;
// overlap-join: the gradient checks of each rank's own iterations (rank 1 has 3)
// plus the parameters after the join.
constexpr long kOverlapJoinChecks = 60;

}  // namespace

TEST_CASE("zero multiprocess: bitwise parity with a plain optimizer through dopt-run (2, 3, 5 processes)",
          "[zero][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  kPeer.require_ok_through_dopt_run(n, {"parity"}, kParityChecks);
}

TEST_CASE("zero multiprocess: bitwise parity, processes started by hand (3, 5)", "[zero][multiprocess]") {
  const int n = GENERATE(3, 5);
  kPeer.require_ok_by_hand(n, {"parity"}, kParityChecks);
}

TEST_CASE("zero multiprocess: sharded checkpoint saved by 3 processes resumes at 2 and 5 like an uninterrupted run",
          "[zero][multiprocess]") {
  const auto dir = kPeer.case_dir("ckpt");
  kPeer.require_ok_through_dopt_run(3, {"save", dir.path.string()}, kCkptChecks);
  for (const char* cfg : {"Adam-plain", "Adam-bucket", "SGD-bucket"})
    for (int r = 0; r < 3; ++r) {
      INFO(cfg << " shard " << r);
      CHECK(fs::exists(dir.path / cfg / ("optim-rank" + std::to_string(r) + "-of-3.safetensors")));
    }
  {
    INFO("load at 2 (by hand)");
    kPeer.require_ok_by_hand(2, {"load", dir.path.string(), "3"}, kCkptChecks);
  }
  {
    INFO("load at 5 (dopt-run)");
    kPeer.require_ok_through_dopt_run(5, {"load", dir.path.string(), "3"}, kCkptChecks);
  }
  {
    INFO("load at 3 (dopt-run)");
    kPeer.require_ok_through_dopt_run(3, {"load", dir.path.string(), "3"}, kCkptChecks);
  }
}

TEST_CASE("zero multiprocess: sharded checkpoint saved by 5 processes resumes at 2", "[zero][multiprocess]") {
  const auto dir = kPeer.case_dir("ckpt5");
  kPeer.require_ok_through_dopt_run(5, {"save", dir.path.string()}, kCkptChecks);
  kPeer.require_ok_by_hand(2, {"load", dir.path.string(), "5"}, kCkptChecks);
}

TEST_CASE("zero multiprocess: uneven inputs under Join (rank 1 has fewer batches) through dopt-run (2, 3, 5)",
          "[zero][join][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  kPeer.require_ok_through_dopt_run(n, {"join"}, kJoinChecks);
}

TEST_CASE("zero multiprocess: uneven inputs under Join, processes started by hand (3)", "[zero][join][multiprocess]") {
  kPeer.require_ok_by_hand(3, {"join"}, kJoinChecks);
}

TEST_CASE("zero multiprocess: overlap_with_ddp equals a plain optimizer on the reducer's averages, through dopt-run "
          "(2, 3, 5)",
          "[zero][overlap][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  kPeer.require_ok_through_dopt_run(n, {"overlap"}, kParityChecks);
}

TEST_CASE("zero multiprocess: overlap_with_ddp, processes started by hand (3)", "[zero][overlap][multiprocess]") {
  kPeer.require_ok_by_hand(3, {"overlap"}, kParityChecks);
}

TEST_CASE("zero multiprocess: overlap_with_ddp under Join, the joined rank owns a bucket, through dopt-run (2, 3, 5)",
          "[zero][overlap][join][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  kPeer.require_ok_through_dopt_run(n, {"overlap-join"}, kOverlapJoinChecks);
}

TEST_CASE("zero multiprocess: overlap_with_ddp over the TCP data plane (DOPT_TRANSPORT=tcp), 3 processes, with Join",
          "[zero][overlap][multiprocess]") {
  auto env = kPeer.env;
  env["DOPT_TRANSPORT"] = "tcp";
  PeerProgram{"zero", env}.require_ok_through_dopt_run(3, {"overlap"}, kParityChecks);
  PeerProgram{"zero", env}.require_ok_through_dopt_run(3, {"overlap-join"}, kOverlapJoinChecks);
}
