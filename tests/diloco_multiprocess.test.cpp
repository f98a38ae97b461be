// DiLoCo between real processes: tests/diloco_peer.cpp is one rank; it checks
// Streaming DiLoCo against the float64 reference, quantized_all_reduce in
// every wire format against its float64 reference, the agreement of every
// rank's anchors for every wire format, and a bitwise resume from a
// checkpoint with an average in flight, and prints "ok R CHECKS". Launched
// through dopt-run and by hand. CTest label "multiprocess", 60 s timeout
// (tests/rendezvous.cmake).
#include <catch2/catch.hpp>

#include <filesystem>

#include "processes.hpp"

namespace {

using namespace dopt::testing;

const PeerProgram kPeer{"diloco", {{"DOPT_TIMEOUT_MS", "30000"}}};

// Per rank: 13 steps x 4 parameters against the reference, 5 formats x
// (2 + world) for quantized_all_reduce, 5 formats x (4 parameters x world + 1), 1 + 8 steps x 2 comparisons of the resumed run.
long min_checks(int n) { return 13 * 4 + 5 * (2 + n) + 5 * (4 * n + 1) + 1 + 8 * 2 * 4; }

}  // namespace

TEST_CASE("diloco multiprocess: reference, wire formats, resume through dopt-run (2, 3, 5 processes)",
          "[diloco][multiprocess]") {
  const int n = GENERATE(2, 3, 5);
  const auto dir = kPeer.case_dir("run" + std::to_string(n));
  kPeer.require_ok_through_dopt_run(n, {"diloco", dir.path.string()}, min_checks(n));
}

TEST_CASE("diloco multiprocess: processes started by hand (3)", "[diloco][multiprocess]") {
  const auto dir = kPeer.case_dir("hand3");
  kPeer.require_ok_by_hand(3, {"diloco", dir.path.string()}, min_checks(3));
}
