// ZeRO stage 3 between real processes: tests/zero_stage3_peer.cpp is one
// rank; it runs stage 1 and stage 3 (copying and in-place gradients, in
// their own buffer or in the gathered memory) over
// the same world group and checks
// that stage 3's parameters and consolidated state are stage 1's, bit for
// bit, and prints "ok R CHECKS". Launched through dopt-run. CTest label
// "multiprocess", 60 s timeout (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include "processes.hpp"

TEST_CASE("zero stage 3 multiprocess: bit for bit stage 1 with the Reducer through dopt-run (2, 3 processes)",
          "[zero][zero3][multiprocess]") {
  const dopt::testing::PeerProgram peer{"zero_stage3", {{"DOPT_TIMEOUT_MS", "30000"}}};
  // Per rank at least 65 checks: 7 configurations (2 of them writing
  // gradient_buffers, 2 release_for_gradients, with the two-buffers
  // check), each with 8 parameters and the gathered-units check (rank 0
  // also checks the state).
  peer.require_ok_through_dopt_run(GENERATE(2, 3), {"parity"}, 65);
}
