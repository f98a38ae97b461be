// dopt_bench_sim_scale: one ZeroRedundancyOptimizer step (Adam) of R ranks
// under the deterministic scheduler, in one process: how simulation scales;
// or (--workload diloco) one DiLoCo outer synchronisation.
//
//   dopt_bench_sim_scale [--ranks R] [--params N] [--tensors K] [--runs P] [--seed S] [--max-seconds T]
//                        [--workload zero|diloco] [--delay-probability Q --delay-ms D]
//
// Every rank holds the same small model (N float32 elements in K tensors,
// fixed gradients) and takes one step (diloco: moves its parameters by a
// rank's own amount, then averages them through DiLoCoAverager with
// sync_every = 1). --delay-probability delays each collective message of
// every rank with chance Q by up to D ms of virtual time (a fault plan).
// Each of the P runs is one simulate()
// with seed S; the runs must have equal trace hashes (exit 1 otherwise, or
// when a run took longer than T seconds of real time). Prints one JSON line:
//   seconds            real time of the slowest run (simulate() as a whole)
//   peak_rss_mib       the process's peak resident memory (getrusage)
//   rss_per_rank_kib   peak RSS over R, less the RSS before the first run
//   points, virtual_ms scheduling points and virtual time of a run
//   trace              the trace hash of the runs (equal across them)
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/zero.hpp"

#include "bench_util.hpp"

namespace {

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss: KiB on Linux
}

double rss_mib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * 4096.0 / (1024.0 * 1024.0);
}

/// The model (sizes from tensor_sizes), with the gradients of dopt_bench_sim.
std::vector<dopt::Tensor> model(const std::vector<std::int64_t>& sizes, int rank) {
  std::vector<dopt::Tensor> ps;
  ps.reserve(sizes.size());
  int k = 0;
  for (const std::int64_t n : sizes) {
    auto p = dopt::Tensor::full({n}, 0.5);
    p.set_grad(dopt::Tensor::full({n}, 1e-3 * static_cast<double>((k++ + rank) % 7 + 1)));
    ps.push_back(std::move(p));
  }
  return ps;
}

void zero_step(dopt::RankContext& ctx, const std::vector<std::int64_t>& sizes) {
  dopt::optim::ZeroOptions zo;
  zo.process_group = ctx.world();
  dopt::optim::ZeroRedundancyOptimizer(model(sizes, ctx.rank()), dopt::optim::OptimizerSpec{"adam", {{"lr", 1e-3}}}, zo)
      .step();
}

void diloco_sync(dopt::RankContext& ctx, const std::vector<std::int64_t>& sizes) {
  auto ps = model(sizes, ctx.rank());
  dopt::optim::DiLoCoOptions o;
  o.sync_every = 1;
  dopt::optim::DiLoCoAverager diloco(ps, o, ctx.world());
  for (auto& p : ps)  // the inner steps: every rank somewhere else
    p.copy_(dopt::Tensor::full({p.numel()}, 0.5 - 1e-3 * static_cast<double>(ctx.rank() % 13 + 1)));
  diloco.average_parameters(ps);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt deterministic simulation at scale: one ZeRO step of many ranks in one process"};
  int ranks = 1024;
  std::int64_t params = 4096;
  std::int64_t tensors = 4;
  int runs = 1;
  std::uint64_t seed = 1;
  double max_seconds = 0;
  std::string workload = "zero";
  double delay_probability = 0;
  std::int64_t delay_ms = 1;
  app.add_option("--ranks", ranks, "simulated ranks")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--params", params, "float32 elements of the model (every rank holds it)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--tensors", tensors, "parameter tensors")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))->capture_default_str();
  app.add_option("--runs", runs, "runs of the seed (their traces must be equal)")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--seed", seed, "the scheduler's seed")->capture_default_str();
  app.add_option("--max-seconds", max_seconds, "fail when a run takes longer (0: no limit)")->capture_default_str();
  app.add_option("--workload", workload, "zero (one ZeRO step) or diloco (one outer sync)")
      ->check(CLI::IsMember({"zero", "diloco"}))
      ->capture_default_str();
  app.add_option("--delay-probability", delay_probability,
                 "chance of a virtual delay per collective message (0: no faults)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  auto* delay_opt = app.add_option("--delay-ms", delay_ms, "the longest such delay (virtual ms)")
                        ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
                        ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (delay_opt->count() > 0 && !(delay_probability > 0)) {
    std::fprintf(stderr, "dopt_bench_sim_scale: --delay-ms needs --delay-probability above 0 (no delay would fire)\n");
    return 2;
  }
  if (tensors * 55 > params * 10) {
    std::fprintf(stderr, "dopt_bench_sim_scale: --params too small for --tensors\n");
    return 2;
  }
  const auto sizes = dopt::bench::tensor_sizes(params, tensors, true);
  const double rss0 = rss_mib();
  try {
    double slowest = 0;
    std::vector<dopt::SimReport> reps(static_cast<std::size_t>(runs));
    for (int i = 0; i < runs; ++i) {
      dopt::SimulateOptions o;
      o.deterministic = true;
      o.seed = seed;
      o.report = &reps[static_cast<std::size_t>(i)];
      if (delay_probability > 0) o.faults.delay_messages(-1, delay_probability, std::chrono::milliseconds(delay_ms));
      const auto t0 = std::chrono::steady_clock::now();
      dopt::simulate(ranks, [&](dopt::RankContext& ctx) {
        if (workload == "zero") zero_step(ctx, sizes);
        else diloco_sync(ctx, sizes);
      }, o);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      slowest = std::max(slowest, s);
      std::fprintf(stderr, "run %d: %.2f s, %llu points, trace %016llx, peak RSS %.1f MiB\n", i + 1, s,
                   static_cast<unsigned long long>(reps[static_cast<std::size_t>(i)].decisions),
                   static_cast<unsigned long long>(reps[static_cast<std::size_t>(i)].trace_hash), peak_rss_mib());
    }
    bool equal = true;
    for (const auto& r : reps) equal = equal && r.trace_hash == reps[0].trace_hash && r.decisions == reps[0].decisions;
    const double peak = peak_rss_mib();
    std::printf("{\"benchmark\": \"sim_scale_%s\", \"ranks\": %d, \"params\": %lld, \"tensors\": %lld, "
                "\"seconds\": %.3f, \"peak_rss_mib\": %.1f, \"rss_per_rank_kib\": %.1f, \"points\": %llu, "
                "\"virtual_ms\": %.3f, \"trace\": \"%016llx\", \"runs\": %d, \"traces_equal\": %s, \"faults\": \"%s\"}\n",
                workload == "zero" ? "zero_step" : "diloco_sync", ranks, static_cast<long long>(params), static_cast<long long>(tensors), slowest, peak,
                (peak - rss0) * 1024.0 / ranks, static_cast<unsigned long long>(reps[0].decisions),
                static_cast<double>(reps[0].virtual_time.count()) / 1e6,
                static_cast<unsigned long long>(reps[0].trace_hash), runs, equal ? "true" : "false",
                dopt::sim::describe(reps[0].fired).c_str());
    if (!equal) {
      std::fprintf(stderr, "dopt_bench_sim_scale: the runs of seed %llu had different traces\n",
                   static_cast<unsigned long long>(seed));
      return 1;
    }
    if (max_seconds > 0 && slowest > max_seconds) {
      std::fprintf(stderr, "dopt_bench_sim_scale: a run took %.1f s, over the limit of %.1f s\n", slowest, max_seconds);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_sim_scale: %s\n", e.what());
    return 1;
  }
  return 0;
}
