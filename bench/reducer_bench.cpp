// dopt_bench_reducer: one Reducer iteration (mark_ready for every parameter
// in reverse order, as a backward pass produces them, then finalize), with
// and without overlap.
//
//   dopt_bench_reducer --params N --tensors K [--no-overlap] [--ranks R] [--steps S]
//                      [--bucket-mb B] [--compute-us U] [--sizes even|torch]
//
// N float32 elements in K tensors (--sizes even: equal sizes, the default;
// torch: proportional to 1..10 repeating, like the torch baselines in
// bench/compare_post_local_sgd_torch.py); fixed gradients per rank.
// Between two mark_ready calls each rank spins for U microseconds (default
// 0), standing in for the backward computation that overlap hides. Under a
// launcher one rank per process; alone it simulates R ranks (default 2).
// Rank 0 prints one JSON line per mode: ms (median over S steps of the
// slowest rank's iteration time), min_ms, overlap, and the configuration.
// By default both modes run (overlap first); --no-overlap runs only that one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/runtime/launch_env.hpp"

#include "bench_util.hpp"

namespace {

void spin_us(int us) {
  if (us <= 0) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < end) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt gradient reducer benchmark"};
  std::int64_t params = 1 << 22;
  std::int64_t tensors = 64;
  bool no_overlap = false;
  int ranks = 2;
  int steps = 20;
  double bucket_mb = 25.0;
  int compute_us = 0;
  std::string sizes = "even";
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_flag("--no-overlap", no_overlap, "only the mode that launches every bucket in finalize()");
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed iterations")->check(CLI::PositiveNumber);
  app.add_option("--bucket-mb", bucket_mb, "bucket cap in MiB (DDP's bucket_cap_mb)")->check(CLI::PositiveNumber);
  app.add_option("--compute-us", compute_us, "simulated backward work between gradients")->check(CLI::NonNegativeNumber);
  app.add_option("--sizes", sizes, "even: equal sizes; torch: proportional to 1..10")
      ->check(CLI::IsMember({"torch", "even"}));
  CLI11_PARSE(app, argc, argv);
  if (tensors > params) {
    std::fprintf(stderr, "dopt_bench_reducer: --tensors must not exceed --params\n");
    return 2;
  }
  const bool simulated = !dopt::launch_env_from_environment().has_value();
  std::vector<bool> modes = no_overlap ? std::vector<bool>{false} : std::vector<bool>{true, false};
  try {
    dopt::RunOptions ro;
    ro.simulated_ranks = ranks;
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          const std::vector<std::int64_t> numels = dopt::bench::tensor_sizes(params, tensors, sizes == "torch");
          std::vector<dopt::Tensor> ps;
          for (std::int64_t n : numels) ps.push_back(dopt::Tensor::full({n}, 0.5));
          std::vector<dopt::Tensor> grads;
          for (std::int64_t k = 0; k < tensors; ++k)
            grads.push_back(dopt::Tensor::full(ps[static_cast<std::size_t>(k)].shape(),
                                               1e-3 * static_cast<double>((k + ctx.rank()) % 7 + 1)));
          for (bool overlap : modes) {
            dopt::optim::ReducerOptions opts;
            opts.bucket_cap_bytes = static_cast<std::size_t>(bucket_mb * 1024 * 1024);
            opts.overlap = overlap;
            dopt::optim::Reducer reducer(ps, ctx.world(), opts);
            std::vector<double> ms;
            for (int s = -2; s < steps; ++s) {  // two untimed iterations first
              for (std::size_t k = 0; k < ps.size(); ++k) ps[k].grad().defined() ? (void)ps[k].grad().copy_(grads[k]) : ps[k].set_grad(grads[k].clone());
              ctx.world().barrier();
              const auto t0 = std::chrono::steady_clock::now();
              for (std::size_t k = ps.size(); k-- > 0;) {
                spin_us(compute_us);
                reducer.mark_ready(ps[k]);
              }
              reducer.finalize();
              const auto t1 = std::chrono::steady_clock::now();
              if (s >= 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
            }
            ms = dopt::bench::slowest(ctx.world(), ms);
            std::sort(ms.begin(), ms.end());  // ms.front() is the minimum
            const double median = dopt::bench::median(ms);
            if (ctx.rank() == 0) {
              std::printf(
                  "{\"benchmark\": \"reducer_iteration\", \"ms\": %.4f, \"min_ms\": %.4f, \"overlap\": %s, "
                  "\"buckets\": %zu, \"params\": %lld, \"tensors\": %lld, \"bucket_mb\": %.3f, \"compute_us\": %d, "
                  "\"sizes\": \"%s\", \"world_size\": %d, \"steps\": %d, \"simulated\": %s}\n",
                  median, ms.front(), overlap ? "true" : "false", reducer.num_buckets(),
                  static_cast<long long>(params), static_cast<long long>(tensors), bucket_mb, compute_us, sizes.c_str(),
                  ctx.world_size(), steps, simulated ? "true" : "false");
              std::fflush(stdout);
            }
          }
        },
        ro);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_reducer: %s\n", e.what());
    return 1;
  }
  return 0;
}
