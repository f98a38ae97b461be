#pragma once
// Losing a simulated rank on purpose: the rank throws Killed, its peers'
// calls that wait for it end with PeerLostError (dopt/actors/simulate.hpp).
#include <functional>
#include <stdexcept>
#include <string>

#include "dopt/actors/future.hpp"
#include "dopt/actors/simulate.hpp"

namespace dopt::testing {

/// What a rank the test loses throws.
struct Killed : std::runtime_error {
  Killed() : std::runtime_error("killed by the test") {}
};

/// simulate(world, fn, options) where fn throws Killed on the ranks the test
/// loses: simulate's rethrow of Killed is expected, any other error is not.
inline void simulate_losing(int world, const std::function<void(RankContext&)>& fn, const SimulateOptions& options) {
  try {
    simulate(world, fn, options);
  } catch (const Error& e) {
    if (std::string(e.what()).find("killed by the test") == std::string::npos) throw;
  }
}

/// Waits for f; whether it carries a PeerLostError.
inline bool carries_peer_lost(const Future<void>& f) {
  try {
    f.get();
  } catch (const PeerLostError&) {
    return true;
  } catch (...) {
  }
  return false;
}

}  // namespace dopt::testing
