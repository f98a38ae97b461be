// dopt_bench_collectives: time of one collective, as torch's and OpenMPI's
// baselines in ../shared/baselines measure it.
//
//   dopt-run --nproc-per-node 2 --master-port 0 dopt_bench_collectives --op all_reduce --bytes 67108864
//   dopt_bench_collectives --ranks 4 --op broadcast            (simulated ranks in one process)
//
// Without --bytes it sweeps 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB, 256 MiB.
// Each size: `--warmup` calls (default: a tenth of --iters, as the OpenMPI
// baseline, and at least 100 ms: right after start the OS may keep two ranks
// on one core until its load balancer moves one, which a steady job never
// sees), then `--iters` timed calls back to back; the
// time of call k is the largest over the ranks (one all_reduce(max) of the
// per-call times after the loop). Rank 0 prints one JSON object per line:
//   {"op", "world_size", "bytes", "iters", "median_us", "min_us", "max_us",
//    "algbw_gbs", "extra_rss_mib", "mode"}   algbw = bytes / median time;
//   extra_rss_mib: the largest, over the ranks, peak resident memory during
//   the calls of this size minus the resident memory before them (tensors
//   already allocated and touched): what the collective itself costs.
// Sizes follow nccl-tests (and ../shared/baselines/gloo): `bytes` is the whole
// buffer: the tensor of all_reduce, reduce (to rank 0) and broadcast, the output of all_gather
// (each rank contributes bytes / world_size), the input of reduce_scatter
// (each rank keeps bytes / world_size). float32 tensors; reduce op sum.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace {

/// Resident memory of this process in KiB ("VmRSS" or the peak "VmHWM").
long status_kib(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  const std::size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') v = std::atol(line + n + 1);
  std::fclose(f);
  return v;
}

/// Resets the peak resident memory (VmHWM) to the current one.
void reset_peak_rss() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

struct Config {
  std::string op = "all_reduce";
  std::vector<long long> bytes;
  int iters = 0;  // 0: by size
  int warmup = -1;  // -1: iters / 10 and at least 100 ms
  int ranks = 2;
};

int iters_for(long long bytes, int asked) {
  if (asked > 0) return asked;
  if (bytes <= (1 << 20)) return 200;
  if (bytes <= (16 << 20)) return 30;
  return 10;
}

void run(dopt::RankContext& ctx, const Config& cfg, const char* mode) {
  auto& pg = ctx.world();
  const int n = pg.size(), me = pg.rank();
  for (long long bytes : cfg.bytes) {
    const std::int64_t numel = bytes / 4;
    const std::int64_t part = numel / n;
    dopt::Tensor t = dopt::Tensor::full({cfg.op == "all_gather" ? part : numel}, 1.0);
    std::vector<dopt::Tensor> parts;
    dopt::Tensor out;
    if (cfg.op == "all_gather") out = dopt::Tensor::zeros({part * n});
    if (cfg.op == "memcpy") out = dopt::Tensor::zeros({numel});  // the machine's copy rate, for the floors
    if (cfg.op == "reduce_scatter") {
      for (int r = 0; r < n; ++r) parts.push_back(dopt::Tensor::full({part}, 1.0));
      out = dopt::Tensor::zeros({part});
    }
    auto once = [&] {
      if (cfg.op == "all_reduce") pg.all_reduce(t);
      else if (cfg.op == "reduce") pg.reduce(t, 0);
      else if (cfg.op == "broadcast") pg.broadcast(t, 0);
      else if (cfg.op == "all_gather") pg.all_gather_into_tensor(out, t);
      else if (cfg.op == "reduce_scatter") pg.reduce_scatter(out, parts);
      else if (cfg.op == "barrier") pg.barrier();
      else if (cfg.op == "memcpy") std::memcpy(out.data_ptr(), t.data_ptr(), t.nbytes());
      else throw dopt::ValueError("dopt_bench_collectives", "unknown --op '" + cfg.op + "'", me);
    };
    const int iters = iters_for(bytes, cfg.iters);
    pg.barrier();
    reset_peak_rss();
    const long rss_before = status_kib("VmRSS");
    if (cfg.warmup >= 0) {
      for (int i = 0; i < cfg.warmup; ++i) once();
    } else {  // every rank makes the same number of calls: rank 0 decides when to stop
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      for (int done = 0;; done += 8) {
        dopt::Tensor go = dopt::Tensor::from_vector(std::vector<double>{
            (done >= iters / 10 && std::chrono::steady_clock::now() >= until) ? 0.0 : 1.0});
        pg.broadcast(go, 0);
        if (go.data<double>()[0] == 0.0) break;
        for (int i = 0; i < 8; ++i) once();
      }
    }
    pg.barrier();
    std::vector<double> us(static_cast<std::size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      once();
      us[static_cast<std::size_t>(i)] =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    const double extra_mib = static_cast<double>(status_kib("VmHWM") - rss_before) / 1024.0;
    dopt::Tensor times = dopt::Tensor::from_vector(us);
    pg.all_reduce(times, dopt::ReduceOp::max);
    dopt::Tensor extra = dopt::Tensor::from_vector(std::vector<double>{extra_mib});
    pg.all_reduce(extra, dopt::ReduceOp::max);
    if (me != 0) continue;
    std::vector<double> v(times.data<double>(), times.data<double>() + iters);
    std::sort(v.begin(), v.end());
    const double median = v[v.size() / 2];
    std::printf(
        "{\"op\": \"%s\", \"world_size\": %d, \"bytes\": %lld, \"iters\": %d, \"median_us\": %.2f, "
        "\"min_us\": %.2f, \"max_us\": %.2f, \"algbw_gbs\": %.4f, \"extra_rss_mib\": %.1f, \"mode\": \"%s\"}\n",
        cfg.op.c_str(), n, bytes, iters, median, v.front(), v.back(), median > 0 ? bytes / median / 1e3 : 0.0,
        extra.data<double>()[0], mode);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time dopt's collectives (JSON lines from rank 0)"};
  Config cfg;
  app.add_option("--op", cfg.op, "all_reduce | reduce | broadcast | all_gather | reduce_scatter | barrier | memcpy (one rank)")
      ->check(CLI::IsMember({"all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "memcpy"}));
  app.add_option("--bytes", cfg.bytes, "Tensor size(s) in bytes (default: a sweep 4 KiB .. 256 MiB)")
      ->check(CLI::PositiveNumber);
  app.add_option("--iters", cfg.iters, "Timed calls per size (default: 200 up to 1 MiB, 30 up to 16 MiB, else 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", cfg.warmup, "Untimed calls first (default: iters / 10, and at least 100 ms)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ranks", cfg.ranks, "Simulated ranks when not started by a launcher")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (cfg.bytes.empty()) cfg.bytes = {4096, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20};
  try {
    const bool launched = dopt::launch_env_from_environment().has_value();
    dopt::RunOptions ro;
    ro.simulated_ranks = cfg.ranks;
    dopt::run_distributed([&](dopt::RankContext& ctx) { run(ctx, cfg, launched ? "processes" : "simulated"); }, ro);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_collectives: %s\n", e.what());
    return 1;
  }
  return 0;
}
