// Testing distributed code with dopt's deterministic simulation
// (docs/testing.md walks through it).
//
//   dopt-example-sim-testing                 the training code passes: threaded, a swarm of seeds, faults
//   dopt-example-sim-testing --planted-bug   a rank that sees its average late takes a shortcut: the
//                                            swarm finds a seed where the ranks disagree, prints it,
//                                            and the seed replays the same failure (exit code 1)
//   DOPT_SIM_SEED=<seed> dopt-example-sim-testing --planted-bug   replays that one seed
#include <atomic>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/sim.hpp"
#include "dopt/actors/simulate.hpp"

using namespace dopt;

// The code under test: data-parallel gradient descent on y = 3x, each rank
// with its own x; the gradient is averaged over the ranks every step. With
// the planted bug, a rank whose average is not in within 1 ms uses its local
// gradient instead: on an idle machine the average is always in time.
double train(RankContext& ctx, bool planted_bug) {
  double w = 0;
  const double x = 1.0 + ctx.rank();
  for (int step = 0; step < 10; ++step) {
    double g = 2 * (w * x - 3.0 * x) * x;
    Tensor t = Tensor::full({1}, g, DType::float64);
    Future<void> avg = ctx.world().all_reduce_async(t);
    bool in_time = true;
    if (planted_bug) in_time = avg.wait_for(std::chrono::milliseconds(1));
    avg.get();
    if (in_time) g = t.to_vector<double>()[0] / ctx.world_size();
    w -= 0.01 * g;
  }
  return w;
}

// One run of the test: three ranks train; all must end with the same model.
void check_training(const SimulateOptions& options, bool planted_bug) {
  std::vector<double> w(3);
  simulate(3, [&](RankContext& ctx) { w[static_cast<std::size_t>(ctx.rank())] = train(ctx, planted_bug); }, options);
  for (std::size_t r = 1; r < w.size(); ++r)
    if (w[r] != w[0])
      throw std::runtime_error("ranks disagree: rank 0 has w = " + std::to_string(w[0]) + ", rank " +
                               std::to_string(r) + " has w = " + std::to_string(w[r]));
}

int main(int argc, char** argv) {
  const bool planted_bug = argc > 1 && std::string(argv[1]) == "--planted-bug";

  // 1. As usual: every rank on its own thread. This passes almost always,
  //    with the bug too, which is the problem.
  try {
    check_training({}, planted_bug);
    std::printf("threaded run: passed\n");
  } catch (const std::exception& e) {
    std::printf("threaded run: %s\n", e.what());
  }

  // 2. A swarm of seeds: each seed is one schedule of the ranks (and of the
  //    late messages the plan asks for), run twice to check it is deterministic.
  SimulateOptions base;
  base.faults.delay_messages(-1, 0.05, std::chrono::milliseconds(5));  // 5% of the protocol steps up to 5 ms late
  sim::SwarmOptions swarm;
  swarm.seeds = 200;
  swarm.budget = std::chrono::seconds(20);
  const sim::SwarmResult found =
      sim::swarm([&](const SimulateOptions& o) { check_training(o, planted_bug); }, swarm, base);
  if (found.failing_seed) {
    // The seed replays the failure exactly: here, and with DOPT_SIM_SEED.
    SimulateOptions replay = base;
    replay.deterministic = true;
    replay.seed = *found.failing_seed;
    try {
      check_training(replay, planted_bug);
      std::printf("seed %llu did not fail again\n", static_cast<unsigned long long>(*found.failing_seed));
    } catch (const std::exception& e) {
      std::printf("swarm: seed %llu fails after %d seed(s): %s\nreplayed: %s\n",
                  static_cast<unsigned long long>(*found.failing_seed), found.tried, found.failure.c_str(), e.what());
    }
    return 1;
  }
  std::printf("swarm: %d seeds passed, each deterministic\n", found.tried);

  // 3. A crash: rank 2 dies at its 4th collective. The others must fail
  //    with PeerLostError naming it, not hang.
  SimulateOptions crash;
  crash.deterministic = true;
  crash.seed = 7;
  crash.faults.crash(2, 4);
  std::atomic<int> saw_loss{0};
  simulate(3, [&](RankContext& ctx) {
    try {
      train(ctx, planted_bug);
    } catch (const PeerLostError& e) {
      if (std::string(e.what()).find("rank 2") != std::string::npos) ++saw_loss;
    }
  }, crash);
  std::printf("crash of rank 2: %d of 2 survivors saw it\n", saw_loss.load());

  // 4. A stopped rank: the others time out after the group timeout, here
  //    ten minutes of virtual time that pass at once.
  SimulateOptions stop = crash;
  stop.faults = FaultPlan{};
  stop.faults.stop(1, 3);
  stop.timeout = std::chrono::minutes(10);
  std::atomic<int> timed_out{0};
  const auto t0 = std::chrono::steady_clock::now();
  simulate(3, [&](RankContext& ctx) {
    try {
      train(ctx, planted_bug);
    } catch (const TimeoutError&) {
      ++timed_out;
    }
  }, stop);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("stop of rank 1: %d of 2 others timed out after 10 virtual minutes, in %.2f s\n", timed_out.load(), wall);
  return saw_loss == 2 && timed_out == 2 ? 0 : 1;
}
