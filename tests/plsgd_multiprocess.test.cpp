// Post-local SGD, the model averagers and the DDP gradient reducer between
// real processes: tests/plsgd_peer.cpp is one rank; it checks its parameters
// and gradients bitwise against values it computes itself (every rank's
// gradients are a function of (rank, step, index)) and prints "ok R CHECKS".
// Launched through dopt-run and by hand (environment set here). CTest label
// "multiprocess", 60 s timeout (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>

#include "processes.hpp"

namespace {

using namespace dopt::testing;
namespace fs = std::filesystem;

const PeerProgram kPeer{"plsgd", {{"DOPT_TIMEOUT_MS", "30000"}}};

// Checks per rank each scenario makes at least: periodic 2 optimizers x 3
// schedules x 9 steps x 6 parameters; hierarchical 2 configs x 13 steps x 6;
// reducer 5 hooks x 2 modes x 4 iterations x 7 gradients plus no_sync and the
// end-to-end run; join 2 modes x (3..5 batches x 7 + 7).
constexpr long kPeriodicChecks = 2 * 3 * 9 * 6;
constexpr long kHierChecks = 2 * 13 * 6;
constexpr long kReducerChecks = 5 * 2 * 4 * 7 + 2 * 3 * 7 + 7 * 7;
constexpr long kJoinChecks = 2 * (3 * 7 + 7);

}  // namespace

TEST_CASE("plsgd multiprocess: PostLocalSGDOptimizer + PeriodicModelAverager (SGD, Adam, schedules, state dict) "
          "through dopt-run (2, 3, 5 processes)",
          "[plsgd][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  const auto dir = kPeer.case_dir("periodic" + std::to_string(n));
  kPeer.require_ok_through_dopt_run(n, {"periodic", dir.path.string()}, kPeriodicChecks);
}

TEST_CASE("plsgd multiprocess: PostLocalSGDOptimizer + PeriodicModelAverager, processes started by hand (3, 4)",
          "[plsgd][multiprocess]") {
  const int n = GENERATE(3, 4);
  const auto dir = kPeer.case_dir("periodic-hand" + std::to_string(n));
  kPeer.require_ok_by_hand(n, {"periodic", dir.path.string()}, kPeriodicChecks);
}

TEST_CASE("plsgd multiprocess: HierarchicalModelAverager on real subgroups (4 processes, dopt-run and by hand)",
          "[plsgd][multiprocess]") {
  SECTION("dopt-run") { kPeer.require_ok_through_dopt_run(4, {"hierarchical"}, kHierChecks); }
  SECTION("by hand") { kPeer.require_ok_by_hand(4, {"hierarchical"}, kHierChecks); }
}

TEST_CASE("plsgd multiprocess: reducer with every comm hook, no_sync, reducer + PostLocalSGDOptimizer "
          "through dopt-run (2, 3, 4, 5 processes)",
          "[plsgd][reducer][multiprocess]") {
  const int n = GENERATE(2, 3, 4, 5);
  kPeer.require_ok_through_dopt_run(n, {"reducer"}, kReducerChecks);
}

TEST_CASE("plsgd multiprocess: reducer, processes started by hand (3)", "[plsgd][reducer][multiprocess]") {
  kPeer.require_ok_by_hand(3, {"reducer"}, kReducerChecks);
}

TEST_CASE("plsgd multiprocess: reducer under Join with uneven inputs (rank 1 has fewer batches) through dopt-run "
          "(2, 3, 5)",
          "[plsgd][reducer][join][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  kPeer.require_ok_through_dopt_run(n, {"join"}, kJoinChecks);
}

TEST_CASE("plsgd multiprocess: reducer under Join, processes started by hand (4)",
          "[plsgd][reducer][join][multiprocess]") {
  kPeer.require_ok_by_hand(4, {"join"}, kJoinChecks);
}
