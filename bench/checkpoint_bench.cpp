// dopt_bench_checkpoint: what checksums cost a ZeRO sharded checkpoint.
//
//   dopt_bench_checkpoint [--params N] [--tensors K] [--ranks R] [--reps S] [--dir D]
//
// R simulated ranks (default 2) hold a ZeroRedundancyOptimizer(Adam) over N
// float32 parameters (default 50,000,000) in K tensors, after one step (so
// every parameter has its state: step, exp_avg, exp_avg_sq). Then S times,
// alternating which goes first: save_sharded and load_sharded into D with
// checksums (DOPT_CHECKSUMS=on: XXH3-64 of every tensor written, verified on
// load, plus the plausibility checks of the state) and without
// (DOPT_CHECKSUMS=off). A step is timed from a barrier to the slowest rank's
// end. The files are read back from the page cache, the case where
// verification costs the most relative to I/O; saving includes fsync.
//
// Prints one JSON line: medians (ms) of save / load with and without
// checksums, their ratios, the checkpoint's bytes, and XXH3's throughput on
// one core over the same bytes (for context).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <xxhash.h>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"

#include "bench_util.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  CLI::App app{"dopt: ZeRO sharded checkpoint save/load with and without checksums"};
  std::int64_t params = 50'000'000;
  std::int64_t tensors = 64;
  int ranks = 2;
  int reps = 5;
  std::string dir = (fs::temp_directory_path() / ("dopt-bench-checkpoint-" + std::to_string(::getpid()))).string();
  app.add_option("--params", params, "float32 parameters in all")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--ranks", ranks, "simulated ranks")->check(CLI::Range(1, 64));
  app.add_option("--reps", reps, "repetitions of each measurement")->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "checkpoint folder (removed at the end)");
  CLI11_PARSE(app, argc, argv);

  const auto sizes = dopt::bench::tensor_sizes(params, tensors, true);
  std::vector<double> save_on, save_off, load_on, load_off;
  std::int64_t bytes = 0;
  double xxh_gbps = 0;
  dopt::SimulateOptions so;
  so.timeout = std::chrono::minutes(10);
  dopt::simulate(ranks, [&](dopt::RankContext& ctx) {
    std::vector<dopt::Tensor> ps;
    for (std::int64_t n : sizes) {
      ps.push_back(dopt::Tensor::full({n}, 0.5));
      ps.back().set_grad(dopt::Tensor::full({n}, 0.01));
    }
    dopt::optim::ZeroRedundancyOptimizer zero(ps, dopt::optim::OptimizerSpec{"Adam", {}},
                                              dopt::optim::ZeroOptions{ctx.world()});
    zero.step();
    dopt::ProcessGroup world = ctx.world();
    auto timed = [&](const std::function<void()>& f) {
      world.barrier();
      const auto t0 = Clock::now();
      f();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      return dopt::bench::slowest(world, {ms})[0];
    };
    for (int r = 0; r < reps; ++r) {
      for (int k = 0; k < 2; ++k) {
        const bool on = (k == 0) == (r % 2 == 0);  // alternate the order
        world.barrier();
        if (ctx.rank() == 0) ::setenv("DOPT_CHECKSUMS", on ? "on" : "off", 1);  // no rank reads it now
        world.barrier();
        const double s = timed([&] { zero.save_sharded(dir); });
        const double l = timed([&] { zero.load_sharded(dir); });
        if (ctx.rank() == 0) {
          (on ? save_on : save_off).push_back(s);
          (on ? load_on : load_off).push_back(l);
        }
      }
    }
    world.barrier();
    if (ctx.rank() == 0) {
      for (const auto& e : fs::directory_iterator(dir)) bytes += static_cast<std::int64_t>(fs::file_size(e.path()));
      // XXH3 over the state of this rank, for context.
      std::vector<double> gbps;
      for (int r = 0; r < 3; ++r) {
        std::int64_t n = 0;
        volatile std::uint64_t sink = 0;
        const auto t0 = Clock::now();
        for (const auto& [key, st] : zero.optim().state())
          for (const auto& [name, t] : st) {
            sink = sink ^ XXH3_64bits(t.data_ptr(), t.nbytes());
            n += static_cast<std::int64_t>(t.nbytes());
          }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        gbps.push_back(static_cast<double>(n) / s / 1e9);
      }
      xxh_gbps = dopt::bench::median(gbps);
    }
    world.barrier();
  }, so);
  fs::remove_all(dir);
  const double so_ = dopt::bench::median(save_on), sf = dopt::bench::median(save_off);
  const double lo = dopt::bench::median(load_on), lf = dopt::bench::median(load_off);
  std::printf("{\"params\": %lld, \"tensors\": %lld, \"ranks\": %d, \"reps\": %d, \"checkpoint_bytes\": %lld, "
              "\"save_ms_checksums\": %.1f, \"save_ms_plain\": %.1f, \"save_ratio\": %.3f, "
              "\"load_ms_checksums\": %.1f, \"load_ms_plain\": %.1f, \"load_ratio\": %.3f, "
              "\"xxh3_gb_per_s_one_core\": %.2f}\n",
              static_cast<long long>(params), static_cast<long long>(tensors), ranks, reps,
              static_cast<long long>(bytes), so_, sf, so_ / sf, lo, lf, lo / lf, xxh_gbps);
  return 0;
}
