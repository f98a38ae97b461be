// Quoted by docs/testing.md (tests/check_docs.py checks the quotes; CI compiles this file).
// The training function itself is quoted from examples/sim_testing/main.cpp.
#include <chrono>
#include <stdexcept>
#include <vector>

#include "dopt/actors/sim.hpp"
#include "dopt/actors/simulate.hpp"

using namespace dopt;

double train(RankContext& ctx, bool planted_bug);

void check_training(const SimulateOptions& options, bool planted_bug) {
  std::vector<double> w(3);
  simulate(3, [&](RankContext& ctx) { w[ctx.rank()] = train(ctx, planted_bug); }, options);
  for (std::size_t r = 1; r < w.size(); ++r)
    if (w[r] != w[0]) throw std::runtime_error("ranks disagree: ...");
}

void one_deterministic_run(bool planted_bug) {
  SimulateOptions o;
  o.deterministic = true;
  o.seed = 42;
  check_training(o, planted_bug);
}

bool swarm_finds(bool planted_bug) {
  SimulateOptions base;
  base.faults.delay_messages(-1, 0.05, std::chrono::milliseconds(5));  // 5% of the protocol steps up to 5 ms late
  sim::SwarmOptions swarm;
  swarm.seeds = 200;                              // at most 200 seeds
  swarm.budget = std::chrono::seconds(20);        // and no new one after 20 s
  sim::SwarmResult found = sim::swarm([&](const SimulateOptions& o) { check_training(o, planted_bug); }, swarm, base);
  if (found.failing_seed) { /* found.failure says what failed */ }
  return found.failing_seed.has_value();
}

void crash_a_rank() {
  SimulateOptions crash;
  crash.deterministic = true;
  crash.seed = 7;
  crash.faults.crash(2, 4);   // rank 2 dies at its 4th collective
  simulate(3, [&](RankContext& ctx) {
    try { train(ctx, false); } catch (const PeerLostError& e) { /* ranks 0 and 1 land here, naming rank 2 */ }
  }, crash);
}
