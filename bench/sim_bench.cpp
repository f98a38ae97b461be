// dopt_bench_sim: one ZeroRedundancyOptimizer step of simulated ranks, in
// threaded mode (every rank on its own thread at once) and in deterministic
// mode (one thread at a time, seeded schedule, virtual time), in the same run.
//
//   dopt_bench_sim predict ...   (the network model's prediction of a collective: sim_predict.cpp)
//   dopt_bench_sim wake ...      (the model's wake_latency, measured apart: sim_wake.cpp)
//   dopt_bench_sim exchange ...  (the model's exchange terms, measured apart: sim_exchange.cpp)
//   dopt_bench_sim [--params N] [--tensors K] [--optimizer adam] [--ranks R] [--steps S] [--repeats P]
//
// Each repeat runs one simulate() per mode, alternating (threaded first), with
// the same model (N float32 elements in K tensors of sizes proportional to
// 1..10, fixed gradients, as dopt_bench_zero). Inside, after W=2 untimed steps,
// rank 0 times S steps between two barriers (real time). Prints one JSON line:
//   threaded_step_ms / deterministic_step_ms   medians over the repeats of the time per step
//   ratio                                      deterministic / threaded
//   points_per_step                            scheduling points per step (deterministic)
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/zero.hpp"

#include "bench_util.hpp"

int sim_predict_main(int argc, char** argv);  // sim_predict.cpp
int sim_wake_main(int argc, char** argv);     // sim_wake.cpp
int sim_exchange_main(int argc, char** argv); // sim_exchange.cpp

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "predict") return sim_predict_main(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "wake") return sim_wake_main(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "exchange") return sim_exchange_main(argc - 1, argv + 1);
  CLI::App app{"dopt deterministic simulation benchmark: a ZeRO step, deterministic vs threaded"};
  std::int64_t params = 1 << 20;
  std::int64_t tensors = 16;
  std::string optimizer = "adam";
  int ranks = 3;
  int steps = 20;
  int repeats = 5;
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "optimizer name (registry)");
  app.add_option("--ranks", ranks, "simulated ranks")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps per run")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "runs per mode")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (tensors * 55 > params * 10) {
    std::fprintf(stderr, "dopt_bench_sim: --params too small for --tensors\n");
    return 2;
  }
  const auto sizes = dopt::bench::tensor_sizes(params, tensors, true);
  auto run = [&](bool deterministic, std::uint64_t seed, dopt::SimReport* rep) {
    double per_step = 0;
    dopt::SimulateOptions o;
    o.deterministic = deterministic;
    o.seed = seed;
    o.report = rep;
    dopt::simulate(ranks, [&](dopt::RankContext& ctx) {
      std::vector<dopt::Tensor> ps;
      for (std::int64_t k = 0; k < tensors; ++k) {
        const std::int64_t n = sizes[static_cast<std::size_t>(k)];
        ps.push_back(dopt::Tensor::full({n}, 0.5));
        ps.back().set_grad(dopt::Tensor::full({n}, 1e-3 * static_cast<double>((k + ctx.rank()) % 7 + 1)));
      }
      dopt::optim::ZeroOptions zo;
      zo.process_group = ctx.world();
      dopt::optim::ZeroRedundancyOptimizer zero(ps, dopt::optim::OptimizerSpec{optimizer, {{"lr", 1e-3}}}, zo);
      for (int s = 0; s < 2; ++s) zero.step();
      ctx.world().barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) zero.step();
      ctx.world().barrier();
      const auto t1 = std::chrono::steady_clock::now();
      if (ctx.rank() == 0) per_step = std::chrono::duration<double, std::milli>(t1 - t0).count() / steps;
    }, o);
    return per_step;
  };
  try {
    std::vector<double> thr, det;
    std::uint64_t points = 0;
    for (int i = 0; i < repeats; ++i) {
      thr.push_back(run(false, 0, nullptr));
      dopt::SimReport rep;
      det.push_back(run(true, static_cast<std::uint64_t>(i + 1), &rep));
      points += rep.decisions;
    }
    const double t = dopt::bench::median(thr), d = dopt::bench::median(det);
    std::printf("{\"benchmark\": \"sim_zero_step\", \"threaded_step_ms\": %.4f, \"deterministic_step_ms\": %.4f, "
                "\"ratio\": %.3f, \"points_per_step\": %.1f, \"params\": %lld, \"tensors\": %lld, "
                "\"optimizer\": \"%s\", \"world_size\": %d, \"steps\": %d, \"repeats\": %d}\n",
                t, d, d / t, static_cast<double>(points) / repeats / (steps + 2), static_cast<long long>(params),
                static_cast<long long>(tensors), optimizer.c_str(), ranks, steps, repeats);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_sim: %s\n", e.what());
    return 1;
  }
  return 0;
}
