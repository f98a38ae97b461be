#pragma once
// Options of the simulated runs (dopt::simulate) of the unit tests: a world
// timeout short enough that a hang fails the test within a CTest timeout.
// Called on the test thread, before simulate().
#include <chrono>

#include "dopt/actors/simulate.hpp"

namespace dopt::testing {

/// Default SimulateOptions with the world group's timeout set to t.
inline SimulateOptions with_timeout(std::chrono::milliseconds t) {
  SimulateOptions o;
  o.timeout = t;
  return o;
}

}  // namespace dopt::testing
