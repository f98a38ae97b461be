// The agreement on skipped steps and sharded gradient clipping between real
// processes: tests/skip_peer.cpp is one rank; it checks its decisions and
// parameters against values it computes itself and prints "ok R CHECKS".
// Launched through dopt-run. CTest label "multiprocess", 60 s timeout
// (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include "processes.hpp"

namespace {

using dopt::testing::PeerProgram;

const PeerProgram kPeer{"skip", {{"DOPT_TIMEOUT_MS", "30000"}}};

// zero: 6 steps x (decision + 7 parameters) + 5 clip totals + the scale;
// plsgd: 5 decisions + 2 x 4 parameters x ranks + 2.
constexpr long kZeroChecks = 6 * 8 + 5 + 1;
constexpr long kPlsgdChecks = 5 + 2 * 4 + 2;

}  // namespace

TEST_CASE("skip multiprocess: ZeRO + GradScaler + clip_grad_norm, an inf on one rank skips every rank "
          "(2, 3, 5 processes)",
          "[grad_scaler][zero][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  kPeer.require_ok_through_dopt_run(n, {"zero"}, kZeroChecks);
}

TEST_CASE("skip multiprocess: PostLocalSGDOptimizer + GradScaler, the averager stays on schedule through a "
          "skipped step (2, 3, 5 processes)",
          "[grad_scaler][post_local_sgd][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  kPeer.require_ok_through_dopt_run(n, {"plsgd"}, kPlsgdChecks);
}
