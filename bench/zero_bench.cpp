// dopt_bench_zero: one ZeroRedundancyOptimizer step (local step + the
// parameter broadcasts) per iteration.
//
//   dopt_bench_zero --params N --tensors K --optimizer adam [--bucket-view] [--ranks R] [--steps S]
//
// N elements in total, split into K float32 tensors (sizes as even as
// possible). Run under a launcher (dopt-run, torchrun, ...) it is one rank per
// process; started alone it simulates R ranks in this process. Rank 0 prints
// one JSON line: median_ms (wall time of one step(), all ranks aligned by a
// barrier before each), state_bytes_per_rank (max over ranks of the local
// optimizer state), peak_rss_bytes (this process), params, tensors,
// world_size, optimizer, bucket_view, steps.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/optim/zero.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dopt ZeroRedundancyOptimizer step benchmark"};
  std::int64_t params = 1 << 20;
  std::int64_t tensors = 16;
  std::string optimizer = "adam";
  bool bucket_view = false;
  int ranks = 2;
  int steps = 20;
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "optimizer name (registry, case-insensitive)");
  app.add_flag("--bucket-view", bucket_view, "parameters_as_bucket_view");
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps (after one warm-up step)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (tensors > params) {
    std::fprintf(stderr, "dopt_bench_zero: --tensors must not exceed --params\n");
    return 2;
  }

  try {
    dopt::RunOptions ro;
    ro.simulated_ranks = ranks;
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          std::vector<dopt::Tensor> ps;
          for (std::int64_t k = 0; k < tensors; ++k) {
            const std::int64_t n = params / tensors + (k < params % tensors ? 1 : 0);
            ps.push_back(dopt::Tensor::full({n}, 0.5));
            ps.back().set_grad(dopt::Tensor::full({n}, 0.01 * static_cast<double>(k % 7 + 1)));
          }
          dopt::optim::ZeroOptions zo;
          zo.process_group = ctx.world();
          zo.parameters_as_bucket_view = bucket_view;
          dopt::optim::ZeroRedundancyOptimizer zero(ps, dopt::optim::OptimizerSpec{optimizer, {}}, zo);
          zero.step();  // warm-up: creates the state
          std::vector<double> ms;
          for (int s = 0; s < steps; ++s) {
            ctx.world().barrier();
            const auto t0 = std::chrono::steady_clock::now();
            zero.step();
            const auto t1 = std::chrono::steady_clock::now();
            ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          }
          std::sort(ms.begin(), ms.end());
          const double median =
              ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
          dopt::Tensor state = dopt::Tensor::full({1}, static_cast<double>(zero.local_state_bytes()), dopt::DType::int64);
          ctx.world().all_reduce(state, dopt::ReduceOp::max);
          // Rank 0's median; the barrier makes every rank's step start together.
          if (ctx.rank() == 0) {
            rusage ru{};
            getrusage(RUSAGE_SELF, &ru);
            std::printf(
                "{\"benchmark\": \"zero_step\", \"median_ms\": %.4f, \"state_bytes_per_rank\": %lld, "
                "\"peak_rss_bytes\": %lld, \"params\": %lld, \"tensors\": %lld, \"world_size\": %d, "
                "\"optimizer\": \"%s\", \"bucket_view\": %s, \"steps\": %d}\n",
                median, static_cast<long long>(state.data<std::int64_t>()[0]),
                static_cast<long long>(ru.ru_maxrss) * 1024, static_cast<long long>(params),
                static_cast<long long>(tensors), ctx.world_size(), zero.optim().name().c_str(),
                bucket_view ? "true" : "false", steps);
            std::fflush(stdout);
          }
        },
        ro);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_zero: %s\n", e.what());
    return 1;
  }
  return 0;
}
