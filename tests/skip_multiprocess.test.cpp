// The agreement on skipped steps and sharded gradient clipping between real
// processes: tests/skip_peer.cpp is one rank; it checks its decisions and
// parameters against values it computes itself and prints "ok R CHECKS".
// Launched through dopt-run. CTest label "multiprocess", 60 s timeout
// (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include "processes.hpp"

namespace {

const std::string kDoptRun = std::string(DOPT_BINARY_DIR) + "/tools/dopt-run";
const std::string kPeer = std::string(DOPT_BINARY_DIR) + "/tests/dopt_skip_peer";
const std::map<std::string, std::string> kEnv{{"DOPT_TIMEOUT_MS", "30000"}};

// zero: 6 steps x (decision + 7 parameters) + 5 clip totals + the scale;
// plsgd: 5 decisions + 2 x 4 parameters x ranks + 2.
constexpr long kZeroChecks = 6 * 8 + 5 + 1;
constexpr long kPlsgdChecks = 5 + 2 * 4 + 2;

}  // namespace

TEST_CASE("skip multiprocess: ZeRO + GradScaler + clip_grad_norm, an inf on one rank skips every rank "
          "(2, 3, 5 processes)",
          "[grad_scaler][zero][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  INFO(n << " processes");
  dopt::testing::require_ok_through_dopt_run(kDoptRun, kPeer, n, {"zero"}, kEnv, kZeroChecks);
}

TEST_CASE("skip multiprocess: PostLocalSGDOptimizer + GradScaler, the averager stays on schedule through a "
          "skipped step (2, 3, 5 processes)",
          "[grad_scaler][post_local_sgd][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  INFO(n << " processes");
  dopt::testing::require_ok_through_dopt_run(kDoptRun, kPeer, n, {"plsgd"}, kEnv, kPlsgdChecks);
}
