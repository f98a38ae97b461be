// dopt_bench_zero_overlap: one training iteration with ZeRO behind the
// gradient reducer, with and without overlap_with_ddp.
//
//   dopt_bench_zero_overlap --params N --tensors K [--optimizer adam|sgd] [--delays-ms 0,20,50]
//                           [--bucket-mb B] [--ranks R] [--steps S] [--warmup W] [--spin]
//
// N float32 elements in K equal tensors, registered with a Reducer (bucket
// cap B MiB, DDP's 1 MiB first bucket). A simulated backward releases the
// gradients bucket by bucket, in the reducer's bucket order: for each bucket
// it waits D ms (the compute that produces the bucket's gradients; a sleep,
// as when the backward runs on an accelerator, or a busy loop with --spin),
// then sets and marks ready the bucket's gradients. Then:
//   overlap=false   reducer.finalize(); zero.step()  (ZeroRedundancyOptimizer
//                   without overlap: local step on this rank's shard, then the
//                   broadcasts); the reducer still overlaps its reductions.
//   overlap=true    the reducer's comm hook is hook_with_zero_step_interleaved:
//                   each bucket is stepped by its owner and broadcast as soon
//                   as it is reduced; reducer.finalize(); zero.step() (a wait).
// Both setups exist side by side and their iterations alternate (no overlap,
// overlap, no overlap, ...), so load changes on the machine hit both alike.
// Each iteration starts after a barrier; the slowest rank's time counts.
// Rank 0 prints one JSON line per (delay, mode):
//   iter_ms        median iteration time (backward + finalize + step)
//   backward_ms    median time from the start to the end of finalize()
//   step_ms        median time of step() (overlap=false: the whole optimizer
//                  step and broadcasts; overlap=true: what is left to wait)
//   min_iter_ms, and the configuration (params, tensors, buckets,
//   world_size, optimizer, delay_ms, bucket_mb, steps, warmup, simulated)
// and after both modes of a delay one line "zero_overlap_summary":
//   hidden_fraction = median over the step pairs s of
//                     (iter_ms[s] without overlap - iter_ms[s] with overlap) /
//                     step_ms[s] without overlap
//   i.e. how much of the optimizer step and its broadcasts the overlap hid;
//   hidden_fraction_of_medians: the same from the medians.
// Under a launcher (dopt-run) one rank per process; started alone it
// simulates R ranks (default 2).
#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_overlap.hpp"
#include "dopt/runtime/launch_env.hpp"

#include "bench_util.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void compute(double ms, bool spin) {
  if (ms <= 0) return;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
  if (!spin) {
    std::this_thread::sleep_until(end);
    return;
  }
  while (Clock::now() < end) {
  }
}

using dopt::bench::median;
using dopt::bench::slowest;

std::vector<double> parse_list(const std::string& s) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stod(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt ZeRO overlap_with_ddp benchmark"};
  std::int64_t params = 50'000'000;
  std::int64_t tensors = 50;
  std::string optimizer = "adam";
  std::string delays_arg = "0,20,50";
  double bucket_mb = 25.0;
  int ranks = 2;
  int steps = 5;
  int warmup = 1;
  bool spin = false;
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors (equal sizes)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "adam (lr 1e-3) or sgd (lr 0.01, momentum 0.9)")
      ->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--delays-ms", delays_arg, "comma-separated compute delays per bucket, in ms");
  app.add_option("--bucket-mb", bucket_mb, "reducer bucket cap in MiB")->check(CLI::PositiveNumber);
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed iterations per (delay, mode)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed iterations first (the first creates the state)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--spin", spin, "busy-wait the compute delay instead of sleeping");
  CLI11_PARSE(app, argc, argv);
  const std::vector<double> delays = parse_list(delays_arg);
  const bool simulated = !dopt::launch_env_from_environment().has_value();
  const dopt::optim::OptimizerSpec spec =
      optimizer == "adam" ? dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}}
                          : dopt::optim::OptimizerSpec{"SGD", {{"lr", 0.01}, {"momentum", 0.9}}};
  try {
    dopt::RunOptions ro;
    ro.simulated_ranks = ranks;
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          auto& world = ctx.world();
          std::vector<dopt::Tensor> grads;
          for (std::int64_t k = 0; k < tensors; ++k) {
            const std::int64_t n = params / tensors + (k < params % tensors ? 1 : 0);
            grads.push_back(dopt::Tensor::full({n}, 1e-3 * static_cast<double>((k + ctx.rank()) % 7 + 1)));
          }
          // Both setups live side by side; their iterations alternate, so a
          // change in the machine's load hits both modes alike.
          struct Setup {
            std::vector<dopt::Tensor> ps;
            std::unique_ptr<dopt::optim::ZeroRedundancyOptimizer> zero;
            std::unique_ptr<dopt::optim::Reducer> reducer;
            std::vector<std::vector<std::size_t>> buckets;
          };
          auto make_setup = [&](bool overlap) {
            Setup st;
            for (const auto& g : grads) st.ps.push_back(dopt::Tensor::full(g.shape(), 0.5));
            dopt::optim::ZeroOptions zo;
            zo.process_group = world;
            zo.overlap_with_ddp = overlap;
            st.zero = std::make_unique<dopt::optim::ZeroRedundancyOptimizer>(st.ps, spec, zo);
            dopt::optim::ReducerOptions ropts;
            ropts.bucket_cap_bytes = static_cast<std::size_t>(bucket_mb * 1024 * 1024);
            st.reducer = std::make_unique<dopt::optim::Reducer>(st.ps, world, ropts);
            if (overlap)
              st.reducer->register_comm_hook(dopt::optim::hook_with_zero_step_interleaved(
                  dopt::optim::allreduce_hook(world), *st.reducer, *st.zero));
            st.buckets = st.reducer->bucket_indices();
            return st;
          };
          Setup setups[2] = {make_setup(false), make_setup(true)};
          for (double delay : delays) {
            std::vector<double> it_ms[2], bw_ms[2], st_ms[2];
            for (int s = -warmup; s < steps; ++s)
              for (int mode = 0; mode < 2; ++mode) {
                Setup& st = setups[mode];
                world.barrier();
                const auto t0 = Clock::now();
                for (const auto& b : st.buckets) {
                  compute(delay, spin);
                  for (auto i : b) {
                    st.ps[i].set_grad(grads[i]);
                    st.reducer->mark_ready(st.ps[i]);
                  }
                }
                st.reducer->finalize();
                const auto t1 = Clock::now();
                st.zero->step();
                const auto t2 = Clock::now();
                if (s < 0) continue;
                it_ms[mode].push_back(ms_between(t0, t2));
                bw_ms[mode].push_back(ms_between(t0, t1));
                st_ms[mode].push_back(ms_between(t1, t2));
              }
            for (int mode = 0; mode < 2; ++mode) {
              it_ms[mode] = slowest(world, it_ms[mode]);
              bw_ms[mode] = slowest(world, bw_ms[mode]);
              st_ms[mode] = slowest(world, st_ms[mode]);
              if (ctx.rank() == 0) {
                std::printf(
                    "{\"benchmark\": \"zero_overlap_iteration\", \"overlap\": %s, \"iter_ms\": %.3f, "
                    "\"min_iter_ms\": %.3f, \"backward_ms\": %.3f, \"step_ms\": %.3f, \"delay_ms\": %.3f, "
                    "\"spin\": %s, \"params\": %lld, \"tensors\": %lld, \"buckets\": %zu, \"bucket_mb\": %.3f, "
                    "\"optimizer\": \"%s\", \"world_size\": %d, \"steps\": %d, \"warmup\": %d, \"simulated\": %s}\n",
                    mode ? "true" : "false", median(it_ms[mode]),
                    *std::min_element(it_ms[mode].begin(), it_ms[mode].end()), median(bw_ms[mode]),
                    median(st_ms[mode]), delay, spin ? "true" : "false", static_cast<long long>(params),
                    static_cast<long long>(tensors), setups[mode].buckets.size(), bucket_mb, optimizer.c_str(),
                    ctx.world_size(), steps, warmup, simulated ? "true" : "false");
                std::fflush(stdout);
              }
            }
            // Paired: step s of each mode ran back to back.
            std::vector<double> hidden;
            for (std::size_t k = 0; k < it_ms[0].size(); ++k)
              hidden.push_back((it_ms[0][k] - it_ms[1][k]) / st_ms[0][k]);
            if (ctx.rank() == 0) {
              const double no = median(it_ms[0]), ov = median(it_ms[1]), step_no = median(st_ms[0]);
              std::printf(
                  "{\"benchmark\": \"zero_overlap_summary\", \"delay_ms\": %.3f, \"iter_ms_no_overlap\": %.3f, "
                  "\"iter_ms_overlap\": %.3f, \"step_ms_no_overlap\": %.3f, \"backward_ms_no_overlap\": %.3f, "
                  "\"hidden_fraction\": %.3f, \"hidden_fraction_of_medians\": %.3f, \"params\": %lld, "
                  "\"buckets\": %zu, \"world_size\": %d, \"optimizer\": \"%s\", \"steps\": %d, "
                  "\"simulated\": %s}\n",
                  delay, no, ov, step_no, median(bw_ms[0]), median(hidden), step_no > 0 ? (no - ov) / step_no : 0.0,
                  static_cast<long long>(params), setups[0].buckets.size(), ctx.world_size(), optimizer.c_str(),
                  steps, simulated ? "true" : "false");
              std::fflush(stdout);
            }
          }
        },
        ro);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_zero_overlap: %s\n", e.what());
    return 1;
  }
  return 0;
}
