// A planted send/recv race under dopt's deterministic simulation
// (docs/testing.md, "Late and lost sends"; dopt-swarm runs it over seeds).
//
//   dopt-example-sim-p2p-race                 runs check_relay once (threaded, or under
//                                             DOPT_SIM_SEED / dopt-swarm: deterministic);
//                                             exit code 1 when the planted bug shows
//   dopt-example-sim-p2p-race --swarm         a swarm of seeds without faults (passes), then
//                                             with late sends (finds a seed, replays it)
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/sim.hpp"
#include "dopt/actors/simulate.hpp"

using namespace dopt;

// Rank 1 sends its update to rank 0, then tells rank 2 to go on; rank 2
// then sends its own update to rank 0. Rank 0 takes the first update to
// arrive as rank 1's: rank 1's was sent first, and rank 2 sends only after
// hearing from rank 1. The planted bug: nothing orders messages from two
// different senders. A late send from rank 1 lets rank 2's through first.
double relay(RankContext& ctx) {
  auto& pg = ctx.world();
  Tensor update = Tensor::full({1}, 10.0 * ctx.rank(), DType::float64);
  Tensor go = Tensor::zeros({1});
  if (ctx.rank() == 1) {
    Future<void> sent = pg.send_async(update, 0);
    pg.send(go, 2);
    sent.get();
    return 0;
  }
  if (ctx.rank() == 2) {
    pg.recv(go, 1);
    pg.send(update, 0);
    return 0;
  }
  Tensor from1 = Tensor::zeros({1}, DType::float64), from2 = Tensor::zeros({1}, DType::float64);
  Future<void> f1 = pg.recv_async(from1, 1), f2 = pg.recv_async(from2, 2);
  double first = 0;
  for (;;) {  // the first update to arrive is "rank 1's"
    if (f1.wait_for(std::chrono::milliseconds(1))) {
      first = from1.to_vector<double>()[0];
      break;
    }
    if (f2.is_ready()) {
      first = from2.to_vector<double>()[0];
      break;
    }
  }
  f1.get();
  f2.get();
  return first;
}

// One run of the test: rank 0 must have taken rank 1's update first.
void check_relay(const SimulateOptions& options) {
  double first = -1;
  simulate(3, [&](RankContext& ctx) {
    const double v = relay(ctx);
    if (ctx.rank() == 0) first = v;
  }, options);
  if (first != 10.0) throw std::runtime_error("rank 0 took " + std::to_string(first) + " for rank 1's update");
}

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "--swarm") {
    SimReport report;
    SimulateOptions o;
    o.report = &report;
    try {
      check_relay(o);
    } catch (const std::exception& e) {
      std::printf("failed: %s (%s)\n", e.what(), sim::describe(report.fired).c_str());
      return 1;
    }
    std::printf("passed (%s)\n", sim::describe(report.fired).c_str());
    return 0;
  }
  sim::SwarmOptions swarm;
  swarm.seeds = 100;
  swarm.budget = std::chrono::seconds(30);
  const sim::SwarmResult clean = sim::swarm(check_relay, swarm);
  std::printf("without faults: %d seeds, %s\n", clean.tried, clean.failing_seed ? "a seed failed" : "all passed");

  SimulateOptions late;
  late.faults.delay_messages(-1, 0.5, std::chrono::milliseconds(50));  // half the messages up to 50 ms late
  const sim::SwarmResult found = sim::swarm(check_relay, swarm, late);
  if (!found.failing_seed || clean.failing_seed) return 1;
  SimReport report;
  late.deterministic = true;
  late.seed = *found.failing_seed;
  late.report = &report;
  try {
    check_relay(late);
  } catch (const std::exception& e) {
    std::printf("with late sends: seed %llu fails (%s)\nreplayed: %s\n",
                static_cast<unsigned long long>(*found.failing_seed), sim::describe(report.fired).c_str(), e.what());
  }
  return 0;
}
