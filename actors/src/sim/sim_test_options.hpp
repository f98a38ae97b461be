#pragma once
// Options the deterministic-simulation tests (sim*.test.cpp) share.
#include <chrono>
#include <cstdint>

#include "dopt/actors/sim.hpp"
#include "dopt/actors/simulate.hpp"

namespace dopt::sim_test {

/// A deterministic run of `seed` with the group timeout `timeout`, filling rep (may be null).
inline SimulateOptions deterministic(std::uint64_t seed, SimReport* rep, std::chrono::milliseconds timeout) {
  SimulateOptions o;
  o.timeout = timeout;
  o.deterministic = true;
  o.seed = seed;
  o.report = rep;
  return o;
}

/// A swarm of `seeds` seeds within a minute, printing nothing.
inline sim::SwarmOptions quiet_swarm(int seeds) {
  sim::SwarmOptions s;
  s.seeds = seeds;
  s.budget = std::chrono::seconds(60);
  s.print = false;
  return s;
}

}  // namespace dopt::sim_test
