// dopt_bench_post_local_sgd: PostLocalSGDOptimizer steps (local step, plus a
// parameter averaging on the averager's schedule).
//
//   dopt_bench_post_local_sgd --params N --tensors K --optimizer sgd|adam --period P --warmup W
//                             [--ranks R] [--steps S]
//
// N float32 elements split evenly into K tensors; each rank has its own fixed
// gradients (set once, no backward). Under a launcher (dopt-run, torchrun, ...)
// one rank per process; started alone it simulates R ranks (default 2).
// S steps in all (default 40), each started after a barrier; step t averages
// when t >= W and (t - W) % P == 0. Per step the slowest rank's time counts.
// Rank 0 prints one JSON line: local_ms (median over the steps that did not
// average), avg_ms (median over the averaging steps; null if none), their
// counts, and the configuration.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/optim/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/launch_env.hpp"

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return -1.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt PostLocalSGDOptimizer step benchmark"};
  std::int64_t params = 1 << 20;
  std::int64_t tensors = 16;
  std::string optimizer = "sgd";
  std::int64_t period = 4;
  std::int64_t warmup = 0;
  int ranks = 2;
  int steps = 40;
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "sgd or adam")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--period", period, "averaging period")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "averager warmup steps")->check(CLI::NonNegativeNumber);
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "steps")->check(CLI::PositiveNumber);
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
          std::vector<dopt::Tensor> ps;
          for (std::int64_t k = 0; k < tensors; ++k) {
            const std::int64_t n = params / tensors + (k < params % tensors ? 1 : 0);
            ps.push_back(dopt::Tensor::full({n}, 0.5));
            ps.back().set_grad(dopt::Tensor::full({n}, 1e-3 * static_cast<double>((k + ctx.rank()) % 7 + 1)));
          }
          dopt::Hyperparams h;
          h["lr"] = optimizer == "sgd" ? 0.01 : 1e-3;
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
          std::vector<double> local_ms, avg_ms;
          for (std::size_t s = 0; s < ms.size(); ++s) (averaged[s] ? avg_ms : local_ms).push_back(ms[s]);
          if (ctx.rank() == 0) {
            char avg[64];
            if (avg_ms.empty()) std::snprintf(avg, sizeof avg, "null");
            else std::snprintf(avg, sizeof avg, "%.4f", median(avg_ms));
            char loc[64];
            if (local_ms.empty()) std::snprintf(loc, sizeof loc, "null");
            else std::snprintf(loc, sizeof loc, "%.4f", median(local_ms));
            std::printf(
                "{\"benchmark\": \"post_local_sgd_step\", \"local_ms\": %s, \"avg_ms\": %s, \"local_steps\": %zu, "
                "\"avg_steps\": %zu, \"params\": %lld, \"tensors\": %lld, \"optimizer\": \"%s\", \"period\": %lld, "
                "\"warmup\": %lld, \"world_size\": %d, \"steps\": %d, \"simulated\": %s}\n",
                loc, avg, local_ms.size(), avg_ms.size(), static_cast<long long>(params),
                static_cast<long long>(tensors), opt.optim().name().c_str(), static_cast<long long>(period),
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
