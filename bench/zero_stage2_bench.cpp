// dopt_bench_zero_stage2: one training iteration with ZeRO stage 1 (a plain
// Reducer) against stage 2 (the Reducer with zero_stage2_options), and what
// each rank holds for gradients.
//
//   dopt_bench_zero_stage2 --params N --tensors K [--optimizer adam|sgd] [--bucket-mb B]
//                          [--delay-ms D] [--ranks R] [--steps S] [--warmup W] [--only 1|2]
//
// N float32 elements in K tensors (sizes in proportion to 1..10, as the ZeRO
// benchmark's), registered with a Reducer (cap B MiB). A simulated backward
// sets and marks the gradients bucket by bucket in the reducer's order,
// sleeping D ms before each bucket (its compute); then reducer.finalize() and
// zero.step(). The two setups live side by side and their iterations
// alternate (stage 1, stage 2, stage 1, ...), each after a barrier; the
// slowest rank's time counts. Rank 0 prints one JSON line per stage:
//   iter_ms, min_iter_ms, backward_ms (to the end of finalize), step_ms;
//   gradient_bytes: Reducer::gradient_bytes() after finalize (the largest
//   over the ranks), state_bytes: ZeRO's local state (the largest);
// and one "zero_stage2_summary" line: iter_ms of both and their ratio
// (median over the step pairs of stage 2 / stage 1). --only S builds and
// runs stage S alone and prints its line with peak_rss_bytes (the largest
// getrusage ru_maxrss over the ranks; processes only), no summary.
// Under a launcher (dopt-run) one rank per process; alone it simulates R
// ranks (default 2).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <sys/resource.h>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/runtime/launch_env.hpp"

#include "bench_util.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using dopt::bench::median;
using dopt::bench::slowest;

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Stage {
  std::vector<dopt::Tensor> ps;
  std::unique_ptr<dopt::optim::ZeroRedundancyOptimizer> zero;
  std::unique_ptr<dopt::optim::Reducer> reducer;
  std::vector<std::vector<std::size_t>> buckets;
  std::vector<double> iter, backward, step;
  std::int64_t gradient_bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt ZeRO stage 2 against stage 1"};
  std::int64_t params = 10'000'000, tensors = 100;
  std::string optimizer = "adam";
  double bucket_mb = 25.0, delay_ms = 0.0;
  int ranks = 2, steps = 6, warmup = 2, only = 0;
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "adam (lr 1e-3) or sgd (lr 0.01, momentum 0.9)")
      ->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--bucket-mb", bucket_mb, "reducer bucket cap in MiB")->check(CLI::PositiveNumber);
  app.add_option("--delay-ms", delay_ms, "compute before each bucket, in ms (a sleep)")->check(CLI::NonNegativeNumber);
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed iterations per stage")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed iterations first")->check(CLI::NonNegativeNumber);
  app.add_option("--only", only, "run stage 1 or 2 alone (with peak_rss_bytes)")->check(CLI::IsMember({1, 2}));
  CLI11_PARSE(app, argc, argv);
  const bool simulated = !dopt::launch_env_from_environment().has_value();
  dopt::RunOptions run_options;
  run_options.simulated_ranks = ranks;
  const dopt::optim::OptimizerSpec spec = optimizer == "adam"
                                               ? dopt::optim::spec_of(dopt::optim::AdamOptions(1e-3))
                                               : dopt::optim::spec_of(dopt::optim::SGDOptions(0.01).momentum(0.9));
  try {
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          auto& world = ctx.world();
          std::vector<dopt::Tensor> grads;
          for (std::int64_t n : dopt::bench::tensor_sizes(params, tensors, true))
            grads.push_back(dopt::Tensor::full({n}, 1e-3 * static_cast<double>(grads.size() % 7 + ctx.rank() + 1)));
          Stage stages[2];
          const int first = only ? only - 1 : 0, last = only ? only - 1 : 1;
          for (int s = first; s <= last; ++s) {
            Stage& st = stages[s];
            for (const auto& g : grads) st.ps.push_back(dopt::Tensor::full(g.shape(), 0.5));
            st.zero = std::make_unique<dopt::optim::ZeroRedundancyOptimizer>(st.ps, spec,
                                                                              dopt::optim::ZeroOptions{world});
            dopt::optim::ReducerOptions ropts;
            ropts.bucket_cap_bytes = static_cast<std::size_t>(bucket_mb * 1024 * 1024);
            if (s == 1) ropts = dopt::optim::zero_stage2_options(*st.zero, st.ps, ropts);
            st.reducer = std::make_unique<dopt::optim::Reducer>(st.ps, world, ropts);
            st.buckets = st.reducer->bucket_indices();
          }
          for (int it = -warmup; it < steps; ++it)
            for (int s = first; s <= last; ++s) {
              Stage& st = stages[s];
              world.barrier();
              const auto t0 = Clock::now();
              for (const auto& b : st.buckets) {
                if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
                for (auto i : b) {
                  st.ps[i].set_grad(grads[i].clone());  // a backward's fresh gradient
                  st.reducer->mark_ready(st.ps[i]);
                }
              }
              st.reducer->finalize();
              const auto t1 = Clock::now();
              st.gradient_bytes = st.reducer->gradient_bytes();
              st.zero->step();
              st.zero->zero_grad(true);
              const auto t2 = Clock::now();
              if (it < 0) continue;
              st.iter.push_back(ms(t2 - t0));
              st.backward.push_back(ms(t1 - t0));
              st.step.push_back(ms(t2 - t1));
            }
          rusage ru{};
          getrusage(RUSAGE_SELF, &ru);
          const double rss = slowest(world, {static_cast<double>(ru.ru_maxrss) * 1024.0})[0];
          for (int s = first; s <= last; ++s) {
            Stage& st = stages[s];
            st.iter = slowest(world, st.iter);
            st.backward = slowest(world, st.backward);
            st.step = slowest(world, st.step);
            const auto held = slowest(world, {static_cast<double>(st.gradient_bytes),
                                              static_cast<double>(st.zero->local_state_bytes())});
            if (ctx.rank() != 0) continue;
            std::printf(
                "{\"benchmark\": \"zero_stage2_iteration\", \"stage\": %d, \"iter_ms\": %.3f, \"min_iter_ms\": %.3f, "
                "\"backward_ms\": %.3f, \"step_ms\": %.3f, \"gradient_bytes\": %.0f, \"state_bytes\": %.0f, "
                "\"peak_rss_bytes\": %.0f, "
                "\"params\": %lld, \"tensors\": %lld, \"buckets\": %zu, \"bucket_mb\": %.3f, \"delay_ms\": %.3f, "
                "\"optimizer\": \"%s\", \"world_size\": %d, \"steps\": %d, \"simulated\": %s}\n",
                s + 1, median(st.iter), *std::min_element(st.iter.begin(), st.iter.end()), median(st.backward),
                median(st.step), held[0], held[1], only ? rss : -1.0, static_cast<long long>(params), static_cast<long long>(tensors),
                st.buckets.size(), bucket_mb, delay_ms, optimizer.c_str(), ctx.world_size(), steps,
                simulated ? "true" : "false");
          }
          if (only) return;
          std::vector<double> ratio;
          for (std::size_t k = 0; k < stages[0].iter.size(); ++k) ratio.push_back(stages[1].iter[k] / stages[0].iter[k]);
          if (ctx.rank() == 0) {
            std::printf(
                "{\"benchmark\": \"zero_stage2_summary\", \"iter_ms_stage1\": %.3f, \"iter_ms_stage2\": %.3f, "
                "\"ratio\": %.3f, \"params\": %lld, \"world_size\": %d, \"optimizer\": \"%s\", \"simulated\": %s}\n",
                median(stages[0].iter), median(stages[1].iter), median(ratio), static_cast<long long>(params),
                ctx.world_size(), optimizer.c_str(), simulated ? "true" : "false");
            std::fflush(stdout);
          }
        },
        run_options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_zero_stage2: %s\n", e.what());
    return 1;
  }
  return 0;
}
