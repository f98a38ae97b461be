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

const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";
const std::string kPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_plsgd_peer";
const std::map<std::string, std::string> kEnv{{"DOPT_TIMEOUT_MS", "30000"}};

void through_dopt_run(int n, const std::vector<std::string>& args, long min_checks) {
  require_ok_through_dopt_run(kDoptRun, kPeer, n, args, kEnv, min_checks);
}

void by_hand(int n, const std::vector<std::string>& args, long min_checks) {
  require_ok_by_hand(kPeer, n, args, kEnv, min_checks);
}

/// A fresh folder under the temp dir, removed by the destructor.
struct CaseDir : dopt::testing::TempDir {
  explicit CaseDir(const std::string& name) : dopt::testing::TempDir("dopt-plsgd-mp", name) {}
};

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
  INFO(n << " processes");
  CaseDir dir("periodic" + std::to_string(n));
  through_dopt_run(n, {"periodic", dir.path.string()}, kPeriodicChecks);
}

TEST_CASE("plsgd multiprocess: PostLocalSGDOptimizer + PeriodicModelAverager, processes started by hand (3, 4)",
          "[plsgd][multiprocess]") {
  const int n = GENERATE(3, 4);
  INFO(n << " processes");
  CaseDir dir("periodic-hand" + std::to_string(n));
  by_hand(n, {"periodic", dir.path.string()}, kPeriodicChecks);
}

TEST_CASE("plsgd multiprocess: HierarchicalModelAverager on real subgroups (4 processes, dopt-run and by hand)",
          "[plsgd][multiprocess]") {
  SECTION("dopt-run") { through_dopt_run(4, {"hierarchical"}, kHierChecks); }
  SECTION("by hand") { by_hand(4, {"hierarchical"}, kHierChecks); }
}

TEST_CASE("plsgd multiprocess: reducer with every comm hook, no_sync, reducer + PostLocalSGDOptimizer "
          "through dopt-run (2, 3, 4, 5 processes)",
          "[plsgd][reducer][multiprocess]") {
  const int n = GENERATE(2, 3, 4, 5);
  INFO(n << " processes");
  through_dopt_run(n, {"reducer"}, kReducerChecks);
}

TEST_CASE("plsgd multiprocess: reducer, processes started by hand (3)", "[plsgd][reducer][multiprocess]") {
  by_hand(3, {"reducer"}, kReducerChecks);
}

TEST_CASE("plsgd multiprocess: reducer under Join with uneven inputs (rank 1 has fewer batches) through dopt-run "
          "(2, 3, 5)",
          "[plsgd][reducer][join][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  INFO(n << " processes");
  through_dopt_run(n, {"join"}, kJoinChecks);
}

TEST_CASE("plsgd multiprocess: reducer under Join, processes started by hand (4)",
          "[plsgd][reducer][join][multiprocess]") {
  by_hand(4, {"join"}, kJoinChecks);
}
