// dopt_bench_diloco: DiLoCo's outer synchronisation (DiLoCoAverager), and how
// much of it a fragment_sync_delay hides behind inner steps.
//
//   dopt_bench_diloco --mode sync    --params N --tensors K --wire float32|bfloat16|float16|int8|int4 [--iters I]
//   dopt_bench_diloco --mode overlap --params N --tensors K --wire W --sync-every H --delay D [--rounds R]
//
// N float32 elements in K tensors (sizes proportional to 1..10, repeating, as
// the torch baselines), one fragment, outer SGD(lr 0.7, momentum 0.9,
// nesterov), fragment_update_alpha 0. Under a launcher one rank per process;
// alone it simulates --ranks ranks. Every timed unit starts after a barrier;
// the slowest rank's time counts; rank 0 prints one JSON line.
//
// sync: sync_every 1, so every average_parameters call is one whole outer
//   synchronisation (pseudo-gradients, average, outer step, parameters
//   reset): sync_ms is the median over --iters calls (after 2 untimed ones).
//   Also the bytes one sync sends per rank, and what DDP's gradient
//   all-reduce sends per step (a ring all-reduce of the float32 gradients).
// overlap: rounds of H inner steps (SGD momentum 0.9 on fixed gradients) with
//   DiLoCo(sync_every H, delay D); round_ms is the median round, inner_ms the
//   median of the same H inner steps without DiLoCo (measured first), and
//   exposed_ms = round_ms - inner_ms the synchronisation cost left on the
//   critical path. The share hidden by the delay is 1 - exposed(D) /
//   exposed(0) (bench/compare_diloco_torch.py computes it). --inner-sleep-ms
//   adds a sleep to every inner step: a stand-in for inner steps computed on
//   an accelerator, which leave the CPU to the background average.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/runtime/launch_env.hpp"

#include "bench_util.hpp"

namespace {

using dopt::bench::median;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt DiLoCo outer synchronisation benchmark"};
  std::string mode = "sync";
  std::int64_t params = 10'000'000, tensors = 100;
  std::string wire = "float32";
  std::int64_t sync_every = 4, delay = 0;
  int ranks = 2, iters = 10, rounds = 6;
  double inner_sleep_ms = 0;
  app.add_option("--mode", mode, "sync | overlap")->check(CLI::IsMember({"sync", "overlap"}));
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--wire", wire, "wire format")->check(CLI::IsMember({"float32", "bfloat16", "float16", "int8", "int4"}));
  app.add_option("--sync-every", sync_every, "overlap: inner steps per round (H)")->check(CLI::PositiveNumber);
  app.add_option("--delay", delay, "overlap: fragment_sync_delay")->check(CLI::NonNegativeNumber);
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "sync: timed syncs")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "overlap: timed rounds")->check(CLI::PositiveNumber);
  app.add_option("--inner-sleep-ms", inner_sleep_ms,
                 "overlap: each inner step also sleeps this long (a stand-in for a step computed on an "
                 "accelerator, which leaves the CPU free)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  const bool simulated = !dopt::launch_env_from_environment().has_value();
  try {
    dopt::RunOptions ro;
    ro.simulated_ranks = ranks;
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          using namespace dopt::optim;
          dopt::ProcessGroup world = ctx.world();
          const int n = ctx.world_size();
          const auto numels = dopt::bench::tensor_sizes(params, tensors, true);
          std::vector<dopt::Tensor> ps;
          for (std::int64_t k = 0; k < tensors; ++k) {
            const std::int64_t m = numels[static_cast<std::size_t>(k)];
            ps.push_back(dopt::Tensor::full({m}, 0.5));
            ps.back().set_grad(dopt::Tensor::full({m}, 1e-3 * static_cast<double>((k + ctx.rank()) % 7 + 1)));
          }
          DiLoCoOptions o;
          o.wire_format = parse_wire_format(wire);
          o.row_size = 256;
          const std::uint64_t ddp_bytes_per_step =
              static_cast<std::uint64_t>(params) * 4 * 2 * static_cast<std::uint64_t>(n - 1) / static_cast<std::uint64_t>(n);
          if (mode == "sync") {
            o.sync_every = 1;
            DiLoCoAverager avg(ps, o, world);
            std::vector<double> ms, prep_ms, wait_ms;
            // Each call moves the parameters a little first, so every sync averages real deltas.
            SGD inner(ps, SGDOptions(1e-3));
            for (int i = 0; i < iters + 2; ++i) {
              inner.step();
              world.barrier();
              const DiLoCoStats s0 = avg.stats();
              const auto t0 = Clock::now();
              avg.average_parameters(std::vector<dopt::Tensor>{});
              if (i >= 2) {
                ms.push_back(ms_since(t0));
                prep_ms.push_back(1e3 * (avg.stats().seconds_preparing - s0.seconds_preparing));
                wait_ms.push_back(1e3 * (avg.stats().seconds_waiting - s0.seconds_waiting));
              }
            }
            ms = dopt::bench::slowest(world, ms);
            prep_ms = dopt::bench::slowest(world, prep_ms);
            wait_ms = dopt::bench::slowest(world, wait_ms);
            const DiLoCoStats st = avg.stats();
            const double bytes_per_sync = static_cast<double>(st.bytes_sent) / (iters + 2);
            if (ctx.rank() == 0) {
              std::printf(
                  "{\"benchmark\": \"diloco_sync\", \"sync_ms\": %.4f, \"sync_ms_min\": %.4f, \"prepare_ms\": %.4f, "
                  "\"wait_ms\": %.4f, \"iters\": %d, "
                  "\"bytes_per_sync\": %.0f, \"ddp_bytes_per_step\": %llu, "
                  "\"ddp_over_diloco_bytes_per_inner_step_h100\": %.2f, \"wire\": \"%s\", \"params\": %lld, "
                  "\"tensors\": %lld, \"world_size\": %d, \"simulated\": %s}\n",
                  median(ms), *std::min_element(ms.begin(), ms.end()), median(prep_ms), median(wait_ms), iters,
                  bytes_per_sync,
                  static_cast<unsigned long long>(ddp_bytes_per_step),
                  bytes_per_sync > 0 ? static_cast<double>(ddp_bytes_per_step) * 100.0 / bytes_per_sync : 0.0,
                  wire.c_str(), static_cast<long long>(params), static_cast<long long>(tensors), n,
                  simulated ? "true" : "false");
              std::fflush(stdout);
            }
            return;
          }
          // overlap
          auto make_inner = [&] {
            return std::make_unique<SGD>(ps, SGDOptions(1e-4).momentum(0.9));
          };
          std::vector<double> inner_ms;
          {
            auto inner = make_inner();
            inner->step();  // allocates the momentum buffers
            for (int r = 0; r < rounds + 1; ++r) {
              world.barrier();
              const auto t0 = Clock::now();
              for (std::int64_t s = 0; s < sync_every; ++s) {
                inner->step();
                if (inner_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(inner_sleep_ms));
              }
              if (r >= 1) inner_ms.push_back(ms_since(t0));
            }
          }
          o.sync_every = sync_every;
          o.fragment_sync_delay = delay;
          auto avg = std::make_unique<DiLoCoAverager>(ps, o, world);
          DiLoCoAverager* d = avg.get();
          PostLocalSGDOptimizer opt(make_inner(), std::move(avg));
          std::vector<double> round_ms, wait_ms;
          for (int r = 0; r < rounds + 1; ++r) {
            world.barrier();
            const double w0 = d->stats().seconds_waiting;
            const auto t0 = Clock::now();
            for (std::int64_t s = 0; s < sync_every; ++s) {
              opt.step();
              if (inner_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(inner_sleep_ms));
            }
            if (r >= 1) {
              round_ms.push_back(ms_since(t0));
              wait_ms.push_back(1e3 * (d->stats().seconds_waiting - w0));
            }
          }
          inner_ms = dopt::bench::slowest(world, inner_ms);
          round_ms = dopt::bench::slowest(world, round_ms);
          wait_ms = dopt::bench::slowest(world, wait_ms);
          if (ctx.rank() == 0) {
            std::printf(
                "{\"benchmark\": \"diloco_overlap\", \"round_ms\": %.4f, \"inner_ms\": %.4f, \"exposed_ms\": %.4f, "
                "\"wait_ms\": %.4f, \"sync_every\": %lld, \"delay\": %lld, \"rounds\": %d, \"wire\": \"%s\", "
                "\"inner_sleep_ms\": %.1f, "
                "\"params\": %lld, \"tensors\": %lld, \"world_size\": %d, \"simulated\": %s}\n",
                median(round_ms), median(inner_ms), median(round_ms) - median(inner_ms), median(wait_ms),
                static_cast<long long>(sync_every), static_cast<long long>(delay), rounds, wire.c_str(), inner_sleep_ms,
                static_cast<long long>(params), static_cast<long long>(tensors), n, simulated ? "true" : "false");
            std::fflush(stdout);
          }
        },
        ro);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_diloco: %s\n", e.what());
    return 1;
  }
  return 0;
}
