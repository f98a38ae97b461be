// dopt_bench_zero_stage3: one training iteration with ZeRO stage 3
// (ShardedUnits, gather with prefetch) against stage 1 (ZeroRedundancyOptimizer
// with a Reducer), and the bytes each rank holds.
//
//   dopt_bench_zero_stage3 --params N --tensors K --units U [--delay-ms D]
//                          [--no-prefetch | --no-backward-prefetch]
//                          [--copy-gradients | --separate-gradient-buffers] [--ranks R] [--steps S] [--warmup W]
//                          [--only 1|3 [--peak-mappings]]
//
// N float32 elements in K tensors (sizes in proportion to 1..10, as the ZeRO
// benchmarks'), grouped in order into U units of about K/U tensors; Adam.
// The loop of a trainer that writes its own forward and backward: per unit
// a forward compute and a backward compute of D ms each (a sleep). Stage 1:
// the forward sleeps; the backward sets and marks each unit's gradients
// after its sleep, then finalize() and step(). Stage 3: the forward gathers
// unit u, prefetches u + 1, sleeps, releases u; the backward gathers u,
// sleeps D/2 (the input's gradient, from the parameters), takes
// release_for_gradients(u) (the gathered memory becomes the gradients'),
// prefetches u - 1, sleeps D/2 (the parameters' gradients), writes the
// gradients there and calls reduce_gradients_async(u): two unit-sized
// buffers at a time. --separate-gradient-buffers: gathers u, prefetches
// u - 1, sleeps D, writes the gradients into gradient_buffers(u) (a buffer
// of their own: three unit-sized buffers), reduce_gradients_async(u),
// releases u; --copy-gradients: the same with its own gradient tensors,
// passed and copied by the library. Then step() (--no-prefetch: each
// gather waits for its all_gather; --no-backward-prefetch: only the
// backward's do). With --only
// unset the two setups live side by side and their iterations alternate
// (each after a barrier; the slowest rank's time counts). Rank 0 prints one
// JSON line per stage (iter_ms, min_iter_ms, kept_bytes: what the rank
// keeps between iterations, the largest over the ranks: stage 1 its
// parameters, gradients and ZeRO state, stage 3 ShardedUnits::bytes();
// peak_gathered_bytes and peak_buffer_bytes: stage 3's largest
// gathered_bytes() and buffer_bytes(); prefetch: true, "forward" or false,
// null for stage 1; gradients: "gathered", "buffers" or "copy") and a
// "zero_stage3_summary" line (the median ratio of stage 3 / stage 1 over
// the iteration pairs). --only S builds and runs stage S alone and adds the
// process's memory, each the largest over the ranks (processes only):
// peak_rss_bytes (getrusage), rss_before_bytes (VmRSS before either stage
// was built: the process's own), peak_rss_rise_bytes (their difference),
// peak_pss_bytes and pss_before_bytes (/proc/self/smaps_rollup's Pss, which
// counts a page shared by k processes as 1/k of it, polled every 2 ms by a
// thread from before the build to the end of the timed loop; with
// peak_pss_anon/shmem/file_bytes, its parts at that peak: private memory,
// the shared-memory plane's segment, binary and libraries), and for stage
// 3 target_bytes: kept_bytes plus two of the largest unit's gathered bytes
// (16/N B per parameter with Adam plus two gathered units). --peak-mappings
// adds rank 0's "zero_stage3_peak_mappings" line: at its peak Pss, each
// private anonymous mapping ([heap] or unnamed) with at least 256 KiB
// resident, its size and resident bytes in address order (which buffers are
// live at the peak: their sizes name them). Under a launcher (dopt-run) one
// rank per process; alone it simulates R ranks (default 2).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/runtime/launch_env.hpp"

#include "bench_util.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using dopt::Tensor;
using namespace dopt::optim;

struct Setup {
  double delay_ms = 0.0;
  bool prefetch = true;
  bool backward_prefetch = true;
  bool copy_gradients = false;  // stage 3: pass own gradients (copied) instead of gradient_buffers
  bool separate_buffers = false;  // stage 3: gradient_buffers instead of release_for_gradients
  int rank = 0;
  std::vector<std::vector<std::size_t>> units;  // tensor indices of each unit
  std::vector<std::int64_t> sizes;              // of each tensor
  /// This rank's fresh gradient of tensor i, made when the backward reaches
  /// it (no rank holds every gradient in advance: stage 3's peak RSS is its own).
  double grad_value(std::size_t i) const {
    return 1e-3 * static_cast<double>(i % 7 + static_cast<std::size_t>(rank) + 1);
  }
  Tensor grad(std::size_t i) const { return Tensor::full({sizes[i]}, grad_value(i)); }
};

/// A field of a /proc file in bytes ("Name:   123 kB"); -1 when absent.
double proc_kb_field(const char* path, const char* name) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return -1.0;
  char line[256];
  double out = -1.0;
  const std::size_t n = std::strlen(name);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, name, n) == 0 && line[n] == ':') {
      out = std::strtod(line + n + 1, nullptr) * 1024.0;
      break;
    }
  std::fclose(f);
  return out;
}

/// /proc/self/smaps_rollup's Pss and its parts, in bytes (-1: absent).
struct Pss {
  double total = -1, anon = -1, file = -1, shmem = -1;
  static Pss now() {
    Pss p;
    std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
    if (!f) return p;
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      auto field = [&](const char* name, double& out) {
        const std::size_t n = std::strlen(name);
        if (std::strncmp(line, name, n) == 0 && line[n] == ':') out = std::strtod(line + n + 1, nullptr) * 1024.0;
      };
      field("Pss", p.total);
      field("Pss_Anon", p.anon);
      field("Pss_File", p.file);
      field("Pss_Shmem", p.shmem);
    }
    std::fclose(f);
    return p;
  }
};

/// The private anonymous mappings of /proc/self/smaps with at least 256 KiB
/// resident, as JSON objects {"name", "size_bytes", "rss_bytes"}, in address order.
std::string anonymous_mappings() {
  std::string out;
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return out;
  char line[512];
  unsigned long long lo = 0, hi = 0;
  std::string name;
  bool anonymous = false;
  while (std::fgets(line, sizeof line, f)) {
    char perms[8] = {}, path[256] = {};
    if (std::sscanf(line, "%llx-%llx %7s %*s %*s %*s %255s", &lo, &hi, perms, path) >= 3) {
      name = path;
      anonymous = perms[3] == 'p' && (name.empty() || name == "[heap]");
      continue;
    }
    if (!anonymous || std::strncmp(line, "Rss:", 4) != 0) continue;
    const double rss = std::strtod(line + 4, nullptr) * 1024.0;
    if (rss < 256.0 * 1024.0) continue;
    char item[160];
    std::snprintf(item, sizeof item, "%s{\"name\": \"%s\", \"size_bytes\": %llu, \"rss_bytes\": %.0f}",
                  out.empty() ? "" : ", ", name.c_str(), hi - lo, rss);
    out += item;
  }
  std::fclose(f);
  return out;
}

/// The largest Pss of this process (with its parts at that moment) seen by
/// a thread that polls every 2 ms while it lives; with `mappings`, also
/// anonymous_mappings() at that peak.
class PssPeak {
 public:
  explicit PssPeak(bool mappings)
      : mappings_(mappings), first_(Pss::now()), peak_(first_), thread_([this] { poll(); }) {}
  ~PssPeak() { stop(); }
  /// Joins the poller; first() and peak() are read after it.
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const Pss& first() const { return first_; }
  const Pss& peak() const { return peak_; }
  const std::string& peak_mappings() const { return peak_mappings_; }

 private:
  void poll() {
    while (!stop_) {
      const Pss p = Pss::now();
      if (p.total > peak_.total) {
        peak_ = p;
        if (mappings_) peak_mappings_ = anonymous_mappings();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  const bool mappings_;
  Pss first_;
  Pss peak_;                   // the poller's until stop()
  std::string peak_mappings_;  // the poller's until stop()
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void compute(const Setup& s, double part = 1.0) {
  if (s.delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(s.delay_ms * part));
}

/// Stage 1: every parameter in full on every rank.
struct StageOne {
  std::vector<Tensor> ps;
  std::unique_ptr<ZeroRedundancyOptimizer> zero;
  std::unique_ptr<Reducer> reducer;
  std::int64_t kept_bytes() const {
    std::int64_t b = zero->local_state_bytes();
    for (const auto& p : ps) b += 2 * static_cast<std::int64_t>(p.nbytes());  // the parameter and its gradient
    return b;
  }
  void iterate(const Setup& s) {
    for (std::size_t u = 0; u < s.units.size(); ++u) compute(s);
    for (std::size_t u = s.units.size(); u-- > 0;) {
      compute(s);
      for (auto i : s.units[u]) {
        ps[i].set_grad(s.grad(i));
        reducer->mark_ready(ps[i]);
      }
    }
    reducer->finalize();
    zero->step();
    zero->zero_grad(true);
  }
};

/// Stage 3: this rank's shards, two units gathered at a time.
struct StageThree {
  std::unique_ptr<ShardedUnits> model;
  std::int64_t peak_gathered = 0, peak_buffers = 0;
  void note() {
    peak_gathered = std::max(peak_gathered, model->gathered_bytes());
    peak_buffers = std::max(peak_buffers, model->buffer_bytes());
  }
  void iterate(const Setup& s) {
    const std::size_t n = s.units.size();
    for (std::size_t u = 0; u < n; ++u) {
      (void)model->gather(u);
      if (s.prefetch && u + 1 < n) (void)model->prefetch(u + 1);
      note();
      compute(s);
      model->release(u);
    }
    const bool backward_prefetch = s.prefetch && s.backward_prefetch;
    const bool in_gathered = !s.copy_gradients && !s.separate_buffers;
    for (std::size_t u = n; u-- > 0;) {
      (void)model->gather(u);
      if (in_gathered) {
        note();
        compute(s, 0.5);  // the input's gradient, from the parameters
        const std::vector<Tensor> bufs = model->release_for_gradients(u);
        if (backward_prefetch && u > 0) (void)model->prefetch(u - 1);
        note();
        compute(s, 0.5);  // the parameters' gradients, into bufs
        for (std::size_t k = 0; k < bufs.size(); ++k) bufs[k].fill_(s.grad_value(s.units[u][k]));
        (void)model->reduce_gradients_async(u);
        continue;
      }
      if (backward_prefetch && u > 0) (void)model->prefetch(u - 1);
      note();
      compute(s);
      if (s.copy_gradients) {
        std::vector<Tensor> grads;
        for (auto i : s.units[u]) grads.push_back(s.grad(i));
        (void)model->reduce_gradients_async(u, grads);
      } else {
        const std::vector<Tensor> bufs = model->gradient_buffers(u);
        note();
        for (std::size_t k = 0; k < bufs.size(); ++k) bufs[k].fill_(s.grad_value(s.units[u][k]));
        (void)model->reduce_gradients_async(u);
      }
      model->release(u);
    }
    model->step();
  }
};

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt ZeRO stage 3 against stage 1"};
  std::int64_t params = 10'000'000, tensors = 100, unit_count = 10;
  double delay_ms = 0.0;
  int ranks = 2, steps = 6, warmup = 2, only = 0;
  bool no_prefetch = false, no_backward_prefetch = false, copy_gradients = false, separate_buffers = false,
       peak_mappings = false;
  app.add_option("--params", params, "total number of float32 elements")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "number of parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--units", unit_count, "units (groups of consecutive tensors)")->check(CLI::PositiveNumber);
  app.add_option("--delay-ms", delay_ms, "forward and backward compute per unit, in ms (a sleep)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-prefetch", no_prefetch, "stage 3 without prefetch (each gather waits for its all_gather)");
  app.add_flag("--no-backward-prefetch", no_backward_prefetch,
               "stage 3 prefetches in the forward only (the backward's gathers wait)");
  app.add_flag("--copy-gradients", copy_gradients,
               "stage 3 passes its own gradient tensors (copied) instead of writing gradient_buffers");
  app.add_flag("--separate-gradient-buffers", separate_buffers,
               "stage 3 writes gradient_buffers (a buffer of their own) instead of the gathered memory "
               "(release_for_gradients)");
  app.add_option("--ranks", ranks, "simulated ranks when not launched")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed iterations per stage")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed iterations first")->check(CLI::NonNegativeNumber);
  app.add_option("--only", only, "run stage 1 or 3 alone (with peak_rss_bytes)")->check(CLI::IsMember({1, 3}));
  app.add_flag("--peak-mappings", peak_mappings,
               "with --only: print rank 0's anonymous mappings at its peak Pss (which buffers are live)");
  CLI11_PARSE(app, argc, argv);
  if (unit_count > tensors) unit_count = tensors;
  const bool simulated = !dopt::launch_env_from_environment().has_value();
  dopt::RunOptions run_options;
  run_options.simulated_ranks = ranks;
  const OptimizerSpec spec = spec_of(AdamOptions(1e-3));
  try {
    dopt::run_distributed(
        [&](dopt::RankContext& ctx) {
          auto& world = ctx.world();
          Setup setup;
          setup.delay_ms = delay_ms;
          setup.rank = ctx.rank();
          setup.prefetch = !no_prefetch;
          setup.backward_prefetch = !no_backward_prefetch;
          setup.copy_gradients = copy_gradients;
          setup.separate_buffers = separate_buffers;
          const auto sizes = dopt::bench::tensor_sizes(params, tensors, true);
          setup.sizes = sizes;
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            const auto u = static_cast<std::size_t>(static_cast<std::int64_t>(i) * unit_count / tensors);
            if (u >= setup.units.size()) setup.units.emplace_back();
            setup.units[u].push_back(i);
          }
          // The process without either stage; the Pss poller (one per rank's process) starts here.
          const double own_rss0 = proc_kb_field("/proc/self/status", "VmRSS");
          const double rss0 = dopt::bench::slowest(world, {own_rss0})[0];
          std::unique_ptr<PssPeak> pss;
          if (only && !simulated) pss = std::make_unique<PssPeak>(peak_mappings);
          StageOne one;
          StageThree three;
          const bool run1 = only != 3, run3 = only != 1;
          if (run1) {
            for (auto n : sizes) one.ps.push_back(Tensor::full({n}, 0.5));
            one.zero = std::make_unique<ZeroRedundancyOptimizer>(one.ps, spec, ZeroOptions{world});
            one.reducer = std::make_unique<Reducer>(one.ps, world);
          }
          if (run3) {
            std::vector<std::vector<Tensor>> units;
            for (const auto& idx : setup.units) {
              units.emplace_back();
              for (auto i : idx) units.back().push_back(Tensor::full({sizes[i]}, 0.5));
            }
            three.model = std::make_unique<ShardedUnits>(std::move(units), spec, ShardedUnitsOptions{world});
          }
          std::vector<double> t1, t3;
          for (int it = -warmup; it < steps; ++it) {
            if (run1) {
              world.barrier();
              const auto t0 = Clock::now();
              one.iterate(setup);
              if (it >= 0) t1.push_back(ms(Clock::now() - t0));
            }
            if (run3) {
              world.barrier();
              const auto t0 = Clock::now();
              three.iterate(setup);
              if (it >= 0) t3.push_back(ms(Clock::now() - t0));
            }
          }
          if (pss) pss->stop();
          if (pss && peak_mappings && ctx.rank() == 0)
            std::printf(
                "{\"benchmark\": \"zero_stage3_peak_mappings\", \"rank\": 0, \"peak_pss_anon_bytes\": %.0f, "
                "\"mappings\": [%s]}\n",
                pss->peak().anon, pss->peak_mappings().c_str());
          rusage ru{};
          getrusage(RUSAGE_SELF, &ru);
          const auto mem = dopt::bench::slowest(
              world, {static_cast<double>(ru.ru_maxrss) * 1024.0, static_cast<double>(ru.ru_maxrss) * 1024.0 - own_rss0,
                      pss ? pss->peak().total : -1.0, pss ? pss->first().total : -1.0,
                      pss ? pss->peak().anon : -1.0, pss ? pss->peak().shmem : -1.0, pss ? pss->peak().file : -1.0});
          const double rss = mem[0];
          std::int64_t largest_unit = 0;  // stage 3's largest gathered unit, bytes
          if (run3)
            for (std::size_t u = 0; u < three.model->num_units(); ++u)
              largest_unit = std::max(largest_unit, three.model->shard_numel(u) * ctx.world_size() * 4);
          const char* prefetch_mode = no_prefetch ? "false" : (no_backward_prefetch ? "\"forward\"" : "true");
          const char* gradients_mode =
              copy_gradients ? "\"copy\"" : (separate_buffers ? "\"buffers\"" : "\"gathered\"");
          auto line = [&](int stage, std::vector<double>& t, double kept, double gathered, double buffers) {
            t = dopt::bench::slowest(world, t);
            const auto held = dopt::bench::slowest(world, {kept, gathered, buffers});
            if (ctx.rank() != 0) return;
            std::printf(
                "{\"benchmark\": \"zero_stage3_iteration\", \"stage\": %d, \"iter_ms\": %.3f, \"min_iter_ms\": %.3f, "
                "\"kept_bytes\": %.0f, \"peak_gathered_bytes\": %.0f, \"peak_buffer_bytes\": %.0f, "
                "\"peak_rss_bytes\": %.0f, "
                "\"rss_before_bytes\": %.0f, \"peak_rss_rise_bytes\": %.0f, \"peak_pss_bytes\": %.0f, "
                "\"pss_before_bytes\": %.0f, \"peak_pss_anon_bytes\": %.0f, \"peak_pss_shmem_bytes\": %.0f, "
                "\"peak_pss_file_bytes\": %.0f, \"target_bytes\": %.0f, \"copy_gradients\": %s, \"gradients\": %s, "
                "\"prefetch\": %s, \"params\": %lld, \"tensors\": %lld, \"units\": %zu, \"delay_ms\": %.3f, "
                "\"world_size\": %d, "
                "\"steps\": %d, \"simulated\": %s}\n",
                stage, dopt::bench::median(t), *std::min_element(t.begin(), t.end()), held[0], held[1], held[2],
                only ? rss : -1.0, only ? rss0 : -1.0, only ? mem[1] : -1.0, mem[2], mem[3], mem[4], mem[5], mem[6],
                stage == 3 ? held[0] + 2.0 * static_cast<double>(largest_unit) : -1.0,
                stage == 3 && copy_gradients ? "true" : "false", stage != 3 ? "null" : gradients_mode,
                stage != 3 ? "null" : prefetch_mode, static_cast<long long>(params), static_cast<long long>(tensors),
                setup.units.size(), delay_ms, ctx.world_size(), steps, simulated ? "true" : "false");
          };
          if (run1) line(1, t1, static_cast<double>(one.kept_bytes()), 0.0, 0.0);
          if (run3)
            line(3, t3, static_cast<double>(three.model->bytes()), static_cast<double>(three.peak_gathered),
                 static_cast<double>(three.peak_buffers));
          if (!only && ctx.rank() == 0) {
            std::vector<double> ratio;  // stage 3 / stage 1, iteration by iteration
            for (std::size_t k = 0; k < t1.size(); ++k) ratio.push_back(t3[k] / t1[k]);
            std::printf(
                "{\"benchmark\": \"zero_stage3_summary\", \"iter_ms_stage1\": %.3f, \"iter_ms_stage3\": %.3f, "
                "\"ratio\": %.3f, \"params\": %lld, \"delay_ms\": %.3f, \"prefetch\": %s, \"gradients\": %s, "
                "\"world_size\": %d, \"simulated\": %s}\n",
                dopt::bench::median(t1), dopt::bench::median(t3), dopt::bench::median(ratio),
                static_cast<long long>(params), delay_ms, prefetch_mode, gradients_mode, ctx.world_size(),
                simulated ? "true" : "false");
          }
          std::fflush(stdout);
        },
        run_options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_zero_stage3: %s\n", e.what());
    return 1;
  }
  return 0;
}
