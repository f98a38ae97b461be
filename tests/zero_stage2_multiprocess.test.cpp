// ZeRO stage 2 between real processes: tests/zero_stage2_peer.cpp is one
// rank; it runs stage 1 and stage 2 over the same world group and checks
// that stage 2's parameters, state and owned gradients are stage 1's, bit
// for bit, and prints "ok R CHECKS". Launched through dopt-run. CTest label
// "multiprocess", 60 s timeout (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include "processes.hpp"

namespace {

using namespace dopt::testing;

const PeerProgram kPeer{"zero_stage2", {{"DOPT_TIMEOUT_MS", "30000"}}};

// Per rank at least: 4 configurations, each with 5+ parameters, some owned
// gradients, the gradient checks and some state tensors.
constexpr long kChecks = 40;

}  // namespace

TEST_CASE("zero stage 2 multiprocess: bit for bit stage 1 with the Reducer through dopt-run (2, 3 processes)",
          "[zero][stage2][multiprocess]") {
  const int n = GENERATE(2, 3);
  kPeer.require_ok_through_dopt_run(n, {"parity"}, kChecks);
}
