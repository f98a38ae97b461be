// dopt_bench_distributed_optimizer: one DistributedOptimizer step(context)
// over K parameter owners, with the gradients already in place.
//
//   dopt-run --nproc-per-node K+1 dopt_bench_distributed_optimizer --owners K --numel-per-owner N
//            --optimizer adam|sgd [--iters I] [--warmup W] [--tensors-per-owner T] [--lr LR]
//            [--redundancy R]
//
// Rank 0 is the trainer ("trainer"), ranks 1..K the owners ("owner1", ...).
// Started without a launcher it simulates the K+1 workers in this process.
// Every owner holds T float32 tensors (N elements in all, split as evenly as
// possible), made there by remote(); the trainer builds one
// DistributedOptimizer(OptimizerSpec{Adam|SGD, lr}) over all of them, makes
// one gradient context and deposits a gradient for every parameter (waited
// for), then times W untimed and I timed `step(ctx)` calls (the same
// gradients every time: what is measured is the fan-out, the owners' local
// steps and the replies, not the deposits). Default lr: 1e-3 for Adam, 1e-2
// for SGD (no momentum).
//
// The trainer prints one JSON line:
//   {"bench": "distributed_optimizer", "owners": K, "numel_per_owner": N,
//    "tensors_per_owner": T, "optimizer": "adam", "iters": I, "warmup": W,
//    "median_ms": ..., "p10_ms": ..., "p90_ms": ..., "min_ms": ..., "mean_ms": ...,
//    "deposit_ms": ..., "simulated": false}
// (deposit_ms: the one deposit of all gradients, for reference).
//
// --redundancy R (DistributedOptimizerOptions::redundancy): each owner's
// parameters and state are mirrored on R buddy owners, which step their copies
// with the gradients the owner forwards (docs/fault-tolerance-optimizers.md). The line
// then also has "redundancy": R and two timings of the bytes each way of
// keeping an owner's copy current would move per step (the median of I RPCs
// from the trainer to owner 2 carrying them: the same transport an owner
// uses to reach its buddy): "send_grads_ms" (one gradient per parameter: what
// forwarding moves) and "send_state_ms" (the parameter and its state: with
// Adam also exp_avg and exp_avg_sq, 3x the bytes; SGD without momentum has no
// state, 1x: what sending the state after each step would move).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "dopt/runtime/launch_env.hpp"

namespace {

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt DistributedOptimizer step benchmark"};
  int owners = 2;
  std::int64_t numel = 1 << 20;
  std::string optimizer = "adam";
  int iters = 50;
  int warmup = 5;
  int tensors = 1;
  double lr = -1;
  int redundancy = 0;
  app.add_option("--owners", owners, "parameter owners K (world size K+1)")->check(CLI::PositiveNumber);
  app.add_option("--numel-per-owner", numel, "float32 elements per owner")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "adam or sgd")->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--iters", iters, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first (the first creates the state)")->check(CLI::NonNegativeNumber);
  app.add_option("--tensors-per-owner", tensors, "parameter tensors per owner")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate (default: 1e-3 adam, 1e-2 sgd)");
  app.add_option("--redundancy", redundancy, "buddies per owner (0: none)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (tensors > numel) {
    std::fprintf(stderr, "dopt_bench_distributed_optimizer: --tensors-per-owner exceeds --numel-per-owner\n");
    return 2;
  }
  const auto env = dopt::launch_env_from_environment();
  if (env && env->world_size != owners + 1) {
    std::fprintf(stderr, "dopt_bench_distributed_optimizer: launched with %d processes, --owners %d needs %d\n",
                 env->world_size, owners, owners + 1);
    return 2;
  }
  if (lr < 0) lr = optimizer == "adam" ? 1e-3 : 1e-2;
  const std::string cls = optimizer == "adam" ? "Adam" : "SGD";

  dopt::rpc::register_function("bench.make_param", [](std::int64_t n) { return dopt::Tensor::full({n}, 0.5); });
  dopt::rpc::register_function("bench.sink", [](std::vector<dopt::Tensor> ts) { return static_cast<std::int64_t>(ts.size()); });
  try {
    dopt::rpc::RunOptions so;
    so.simulated_workers = owners + 1;
    so.names = [](int r) { return r == 0 ? std::string("trainer") : "owner" + std::to_string(r); };
    so.runtime_options.threads = std::max(2, std::min(owners + 1, 8));
    dopt::rpc::run(
        [&](dopt::rpc::Agent& a) {
          if (a.rank() != 0) return;  // owners serve until the trainer is done
          std::vector<dopt::rpc::RRef<dopt::Tensor>> params;
          std::vector<std::pair<dopt::rpc::RRef<dopt::Tensor>, dopt::Tensor>> grads;
          for (int o = 1; o <= owners; ++o)
            for (int k = 0; k < tensors; ++k) {
              const std::int64_t n = numel / tensors + (k < numel % tensors ? 1 : 0);
              params.push_back(a.remote<dopt::Tensor>(o, "bench.make_param", n));
              grads.emplace_back(params.back(), dopt::Tensor::full({n}, 1e-3 * (k % 7 + 1)));
            }
          dopt::optim::DistributedOptimizerOptions dopts;
          dopts.redundancy = redundancy;
          dopt::optim::DistributedOptimizer opt(a, dopt::optim::OptimizerSpec{cls, {{"lr", lr}}}, params, dopts);
          dopt::rpc::GradContext ctx = a.new_context();
          const auto d0 = std::chrono::steady_clock::now();
          ctx.deposit_all(grads).get();
          const double deposit_ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
          for (int i = 0; i < warmup; ++i) opt.step(ctx);
          std::vector<double> ms;
          for (int i = 0; i < iters; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            opt.step(ctx);
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          }
          double mean = 0;
          for (double x : ms) mean += x / static_cast<double>(ms.size());
          std::string extra;
          if (redundancy > 0 && owners >= 2) {
            // The bytes of one owner's copy, each way (see the top of this file).
            auto time_send = [&](int copies) {
              std::vector<dopt::Tensor> ts;
              for (int c = 0; c < copies; ++c) ts.push_back(dopt::Tensor::full({numel}, 0.25));
              std::vector<double> v;
              for (int i = 0; i < iters; ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                (void)a.rpc_sync<std::int64_t>(2, "bench.sink", ts);
                v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
              }
              return percentile(v, 0.5);
            };
            const int state_tensors = optimizer == "adam" ? 3 : 1;  // param (+ exp_avg, exp_avg_sq)
            char buf[200];
            std::snprintf(buf, sizeof buf, ", \"redundancy\": %d, \"send_grads_ms\": %.4f, \"send_state_ms\": %.4f",
                          redundancy, time_send(1), time_send(state_tensors));
            extra = buf;
          }
          std::printf(
              "{\"bench\": \"distributed_optimizer\", \"owners\": %d, \"numel_per_owner\": %lld, "
              "\"tensors_per_owner\": %d, \"optimizer\": \"%s\", \"iters\": %d, \"warmup\": %d, "
              "\"median_ms\": %.4f, \"p10_ms\": %.4f, \"p90_ms\": %.4f, \"min_ms\": %.4f, \"mean_ms\": %.4f, "
              "\"deposit_ms\": %.4f, \"simulated\": %s%s}\n",
              owners, static_cast<long long>(numel), tensors, optimizer.c_str(), iters, warmup, percentile(ms, 0.5),
              percentile(ms, 0.1), percentile(ms, 0.9), *std::min_element(ms.begin(), ms.end()), mean, deposit_ms,
              env ? "false" : "true", extra.c_str());
          std::fflush(stdout);
        },
        so);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_distributed_optimizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
