// dopt_bench_zero: one ZeroRedundancyOptimizer step (local step + the
// parameter broadcasts) per iteration.
//
//   dopt_bench_zero --params N --tensors K --optimizer adam [--bucket-view] [--ranks R] [--steps S]
//                   [--warmup W] [--sizes torch|even]
//
// N float32 elements in total, split into K tensors: by default with sizes
// proportional to 1, 2, ..., 10, 1, 2, ... (the last one takes the rest), as
// /work/shared/baselines/zero/bench_zero.py does, or as even as possible
// (--sizes even). Every rank holds the same parameters and its own fixed
// gradients (set once, no backward), as in the torch baseline. Run under a
// launcher (dopt-run, torchrun, ...) it is one rank per process; started
// alone it simulates R ranks in this process.
//
// W warm-up steps (default 2, as torch's script; the first creates the
// state), then S timed steps, each started after a barrier. Rank 0 prints one
// JSON line:
//   median_ms / min_ms      median and minimum over the timed steps of the
//                           step time, the max over ranks of each step
//                           (torch's script: the same)
//   local_step_ms           the same for S steps of the local optimizer alone
//                           (zero.optim().step(): no broadcasts), run after
//                           the timed steps
//   state_bytes_per_rank    max over ranks of the bytes of the local
//                           optimizer's state tensors; state_bytes_min the min
//   state_bytes_total       sum over ranks
//   largest_param_state_bytes  the most state bytes one parameter has
//   state_bytes_bound       state_bytes_total / world_size + largest_param_state_bytes
//                           (the sorted-greedy partition stays below it)
//   peak_rss_bytes          max over ranks of the process's peak RSS
//                           (ru_maxrss; with simulated ranks: the one process)
//   params, tensors, world_size, optimizer, bucket_view, steps, warmup,
//   simulated (true when the ranks were simulated)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/launch_env.hpp"

#include "bench_util.hpp"

namespace {


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt ZeroRedundancyOptimizer step benchmark"};
  std::int64_t params = 1 << 20;
  std::int64_t tensors = 16;
  std::string optimizer = "adam";
  std::string sizes_kind = "torch";
  bool bucket_view = false;
  int ranks = 2;
  int steps = 20;
  int warmup = 2;
  double lr = 1e-3;
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "optimizer name (registry, case-insensitive)");
  app.add_flag("--bucket-view", bucket_view, "parameters_as_bucket_view");
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate (torch's script: 1e-3)");
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps before (the first creates the state)")->check(CLI::PositiveNumber);
  app.add_option("--sizes", sizes_kind, "tensor sizes: torch (proportional to 1..10, as the baseline) or even")
      ->check(CLI::IsMember({"torch", "even"}));
  CLI11_PARSE(app, argc, argv);
  if (tensors * 55 > params * 10 && sizes_kind == "torch") {
    std::fprintf(stderr, "dopt_bench_zero: --params too small for --tensors with --sizes torch\n");
    return 2;
  }
  if (tensors > params) {
    std::fprintf(stderr, "dopt_bench_zero: --tensors must not exceed --params\n");
    return 2;
  }
  const bool simulated = !dopt::launch_env_from_environment().has_value();
  const auto sizes = dopt::bench::tensor_sizes(params, tensors, sizes_kind == "torch");

  try {
    dopt::RunOptions ro;
    ro.simulated_ranks = ranks;
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          std::vector<dopt::Tensor> ps;
          for (std::int64_t k = 0; k < tensors; ++k) {
            const std::int64_t n = sizes[static_cast<std::size_t>(k)];
            ps.push_back(dopt::Tensor::full({n}, 0.5));
            ps.back().set_grad(
                dopt::Tensor::full({n}, 1e-3 * static_cast<double>((k + ctx.rank()) % 7 + 1)));
          }
          dopt::optim::ZeroOptions zo;
          zo.process_group = ctx.world();
          zo.parameters_as_bucket_view = bucket_view;
          dopt::optim::ZeroRedundancyOptimizer zero(ps, dopt::optim::OptimizerSpec{optimizer, {{"lr", lr}}}, zo);
          for (int s = 0; s < warmup; ++s) zero.step();
          std::vector<double> ms;
          for (int s = 0; s < steps; ++s) {
            ctx.world().barrier();
            const auto t0 = std::chrono::steady_clock::now();
            zero.step();
            const auto t1 = std::chrono::steady_clock::now();
            ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          }
          // The local optimizer's step alone (no broadcasts), as many times.
          std::vector<double> local_ms;
          for (int s = 0; s < steps; ++s) {
            ctx.world().barrier();
            const auto t0 = std::chrono::steady_clock::now();
            zero.optim().step();
            const auto t1 = std::chrono::steady_clock::now();
            local_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          }
          // Per step, the slowest rank (as torch's script); median over steps.
          auto slowest_median = [&](std::vector<double>& v) {
            v = dopt::bench::slowest(ctx.world(), v);
            std::sort(v.begin(), v.end());
            return dopt::bench::median(v);
          };
          const double median = slowest_median(ms);
          const double local_median = slowest_median(local_ms);
          // State bytes: this rank's total and its largest per-parameter share.
          std::int64_t largest = 0;
          for (const auto& [key, st] : zero.optim().state()) {
            std::int64_t b = 0;
            for (const auto& [name, t] : st)
              if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
            largest = std::max(largest, b);
          }
          const std::int64_t mine = zero.local_state_bytes();
          rusage ru{};
          getrusage(RUSAGE_SELF, &ru);
          const std::int64_t rss = static_cast<std::int64_t>(ru.ru_maxrss) * 1024;
          dopt::Tensor mx = dopt::Tensor::from_vector(std::vector<std::int64_t>{mine, -mine, largest, rss});
          dopt::Tensor sum = dopt::Tensor::from_vector(std::vector<std::int64_t>{mine});
          ctx.world().all_reduce(mx, dopt::ReduceOp::max);
          ctx.world().all_reduce(sum, dopt::ReduceOp::sum);
          const auto m = mx.to_vector<std::int64_t>();
          const std::int64_t total = sum.to_vector<std::int64_t>()[0];
          if (ctx.rank() == 0) {
            std::printf(
                "{\"benchmark\": \"zero_step\", \"median_ms\": %.4f, \"min_ms\": %.4f, \"local_step_ms\": %.4f, "
                "\"state_bytes_per_rank\": %lld, \"state_bytes_min\": %lld, \"state_bytes_total\": %lld, "
                "\"largest_param_state_bytes\": %lld, \"state_bytes_bound\": %lld, "
                "\"peak_rss_bytes\": %lld, \"params\": %lld, \"tensors\": %lld, \"sizes\": \"%s\", "
                "\"world_size\": %d, \"optimizer\": \"%s\", \"bucket_view\": %s, \"steps\": %d, \"warmup\": %d, "
                "\"simulated\": %s}\n",
                median, ms.front(), local_median, static_cast<long long>(m[0]), static_cast<long long>(-m[1]),
                static_cast<long long>(total), static_cast<long long>(m[2]),
                static_cast<long long>(total / ctx.world_size() + m[2]), static_cast<long long>(m[3]),
                static_cast<long long>(params), static_cast<long long>(tensors), sizes_kind.c_str(),
                ctx.world_size(), zero.optim().name().c_str(), bucket_view ? "true" : "false", steps, warmup,
                simulated ? "true" : "false");
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
