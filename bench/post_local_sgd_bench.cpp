// dopt_bench_post_local_sgd: PostLocalSGDOptimizer steps (local step, plus a
// parameter averaging on the averager's schedule).
//
//   dopt_bench_post_local_sgd --params N --tensors K --optimizer sgd|adam --period P --warmup W
//                             [--ranks R] [--steps S] [--sizes torch|even]
//
// Measured like torch 1.13's /work/shared/baselines/postlocal/bench_postlocal.py
// (bench/compare_post_local_sgd_torch.py runs both): N float32 elements in K
// tensors, sizes proportional to 1..10 repeating (--sizes torch, the default;
// --sizes even: equal sizes); SGD(lr 0.01, momentum 0.9) or Adam(lr 1e-3);
// each rank has its own fixed gradients (set once, no backward). Under a
// launcher (dopt-run, torchrun, ...) one rank per process; started alone it
// simulates R ranks (default 2). S steps in all (default 34 = 10 warm-up + 6
// periods of 4), each started after a barrier; step t averages when t >= W
// and (t - W) % P == 0. Per step the slowest rank's time counts.
// Rank 0 prints one JSON line: warmup_ms (median over the steps before W,
// leaving out step 0, which allocates the optimizer state), local_ms (median
// over the non-averaging steps from W on), avg_ms (median over the averaging
// steps), *_ms_min, their counts, avg_minus_local_ms, and the configuration;
// a median without steps is null.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/launch_env.hpp"

#include "bench_util.hpp"

namespace {

using dopt::bench::median;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt PostLocalSGDOptimizer step benchmark"};
  std::int64_t params = 1 << 20;
  std::int64_t tensors = 16;
  std::string optimizer = "sgd";
  std::int64_t period = 4;
  std::int64_t warmup = 10;
  int ranks = 2;
  int steps = 34;
  std::string sizes = "torch";
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "sgd or adam")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--period", period, "averaging period")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "averager warmup steps")->check(CLI::NonNegativeNumber);
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "steps")->check(CLI::PositiveNumber);
  app.add_option("--sizes", sizes, "torch: sizes proportional to 1..10 (bench_postlocal.py); even: equal")
      ->check(CLI::IsMember({"torch", "even"}));
  CLI11_PARSE(app, argc, argv);
  if (tensors > params) {
    std::fprintf(stderr, "dopt_bench_post_local_sgd: --tensors must not exceed --params\n");
    return 2;
  }
  const bool simulated = !dopt::launch_env_from_environment().has_value();
  try {
    dopt::RunOptions ro;
    ro.simulated_ranks = ranks;
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          const std::vector<std::int64_t> numels = dopt::bench::tensor_sizes(params, tensors, sizes == "torch");
          std::vector<dopt::Tensor> ps;
          for (std::int64_t k = 0; k < tensors; ++k) {
            const std::int64_t n = numels[static_cast<std::size_t>(k)];
            ps.push_back(dopt::Tensor::full({n}, 0.5));
            ps.back().set_grad(dopt::Tensor::full({n}, 1e-3 * static_cast<double>((k + ctx.rank()) % 7 + 1)));
          }
          dopt::Hyperparams h;
          h["lr"] = optimizer == "sgd" ? 0.01 : 1e-3;
          if (optimizer == "sgd") h["momentum"] = 0.9;
          auto local = dopt::optim::make_optimizer(dopt::optim::OptimizerSpec{optimizer, h},
                                                   {dopt::optim::OptimizerParamGroup(ps)});
          dopt::optim::PostLocalSGDOptimizer opt(
              std::move(local), std::make_unique<dopt::optim::PeriodicModelAverager>(period, warmup, ctx.world()));
          std::vector<double> ms;
          std::vector<bool> averaged;
          for (int s = 0; s < steps; ++s) {
            averaged.push_back(opt.averager().will_average());
            ctx.world().barrier();
            const auto t0 = std::chrono::steady_clock::now();
            opt.step();
            const auto t1 = std::chrono::steady_clock::now();
            ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          }
          dopt::Tensor times = dopt::Tensor::from_vector(ms);
          ctx.world().all_reduce(times, dopt::ReduceOp::max);
          ms = times.to_vector<double>();
          std::vector<double> warm_ms, local_ms, avg_ms;
          for (std::size_t s = 0; s < ms.size(); ++s) {
            if (averaged[s]) avg_ms.push_back(ms[s]);
            else if (static_cast<std::int64_t>(s) >= warmup) local_ms.push_back(ms[s]);
            else if (s > 0) warm_ms.push_back(ms[s]);  // step 0 allocates the state
          }
          if (ctx.rank() == 0) {
            auto num = [](const std::vector<double>& v, bool min) {
              char b[64];
              if (v.empty()) std::snprintf(b, sizeof b, "null");
              else std::snprintf(b, sizeof b, "%.4f", min ? *std::min_element(v.begin(), v.end()) : median(v));
              return std::string(b);
            };
            std::string diff = "null";
            if (!avg_ms.empty() && !local_ms.empty()) {
              char b[64];
              std::snprintf(b, sizeof b, "%.4f", median(avg_ms) - median(local_ms));
              diff = b;
            }
            std::printf(
                "{\"benchmark\": \"post_local_sgd_step\", \"warmup_ms\": %s, \"local_ms\": %s, \"avg_ms\": %s, "
                "\"avg_minus_local_ms\": %s, \"warmup_ms_min\": %s, \"local_ms_min\": %s, \"avg_ms_min\": %s, "
                "\"warmup_n\": %zu, \"local_n\": %zu, \"avg_n\": %zu, \"params\": %lld, \"tensors\": %lld, "
                "\"sizes\": \"%s\", \"optimizer\": \"%s\", \"period\": %lld, \"warmup\": %lld, \"world_size\": %d, "
                "\"steps\": %d, \"simulated\": %s}\n",
                num(warm_ms, false).c_str(), num(local_ms, false).c_str(), num(avg_ms, false).c_str(), diff.c_str(),
                num(warm_ms, true).c_str(), num(local_ms, true).c_str(), num(avg_ms, true).c_str(), warm_ms.size(),
                local_ms.size(), avg_ms.size(), static_cast<long long>(params), static_cast<long long>(tensors),
                sizes.c_str(), opt.optim().name().c_str(), static_cast<long long>(period),
                static_cast<long long>(warmup), ctx.world_size(), steps, simulated ? "true" : "false");
            std::fflush(stdout);
          }
        },
        ro);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_post_local_sgd: %s\n", e.what());
    return 1;
  }
  return 0;
}
