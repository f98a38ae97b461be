// dopt_bench_survive: what ZeRO's redundancy costs, and how fast a lost rank
// is recovered from, against a restart from a sharded checkpoint.
//
//   dopt_bench_survive [--params N] [--tensors K] [--ranks R] [--steps S] [--interval I]
//                      [--recover step|replay|host_memory]
//   dopt-run --on-failure continue --nproc-per-node R dopt_bench_survive [...]
//
// R simulated ranks (default 4), or R processes when started by a launcher
// (the lost one then dies of SIGKILL; --ranks is ignored), hold ZeroRedundancyOptimizer(Adam) over N
// float32 parameters (default 50,000,000) in K tensors (default 64), bucket
// view on, the same gradients on every rank. After 2 I steps of warm-up,
// timed per step, from a barrier to the slowest rank's end, in blocks of I
// steps (default 4; the time of a block / I), median of S blocks; the
// configurations below exist at once and their blocks alternate:
//   * step_ms_r0 / step_ms_r1: step() with redundancy 0 and 1 (the buddy's
//     extra optimizer step over 1/R of the parameters);
//   * step_ms_replay: redundancy 1 with ZeroBuddyUpdate::replay and
//     snapshot_interval I (a gradient copy per step, the owner's state sent
//     to its buddy at the end of every I-th step: one per block); with
//     --recover host_memory the same fields are step_ms_host_memory, ...:
//     redundancy 1 with ZeroBuddyUpdate::host_memory (the shard in shared
//     memory its buddy maps, the owner's update journaled);
//   * train_ms_r0 / train_ms_r1: the same plus a gradient all_reduce (avg) of
//     all N (what a data-parallel training step adds);
//   * step_cpu_ms_r0 / step_cpu_ms_r1: the CPU time of the ranks (simulated: the
//     whole process; processes: the sum over them), user and system, with their
//     executors, over the same steps (and
//     train_cpu_ms_*: over the training steps): what the
//     step costs whatever else the machine runs (the wall times above grow
//     with the load; the ranks' waits poll for 20 us, then sleep);
//   * shard_copy_ms: the alternative to recomputing: every rank sends its
//     shard's state to its buddy (send/recv of the state tensors);
// then, with redundancy 1 (buddies updated as --recover says, default
// replay), after save_sharded of the state:
//   * recovery_ms: rank R-1 is lost after its local step of step I-1 (its
//     function throws; with replay the buddy then has I saved steps to
//     replay, the most it can have); from that moment to the end of the
//     survivors' step() that recovered (the step in flight completed over
//     R-1 ranks);
//   * kill_to_next_step_ms: from the loss to the end of the next full step;
//   * recovery_cpu_ms / kill_to_next_step_cpu_ms: the survivors' CPU time from
//     the start of the step in which the rank is lost to their barrier after
//     the recovery, and to the end of the next step; restart_cpu_ms;
//   * restart_ms: over the survivors, a new ZeroRedundancyOptimizer,
//     load_sharded of the checkpoint (page cache) and one step: what a restart
//     from the last checkpoint costs at least (without starting processes,
//     the rendezvous, reloading the model, or the steps since the checkpoint).
// Also dev_shm_huge: the huge= mode of /dev/shm (host_memory's segments get
// 2 MiB pages only where it is not "never"; bench/compare_host_memory_pages.sh).
// One JSON line.
#include <sys/resource.h>
#include <csignal>
#include <fstream>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/runtime/settings.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/internal/shm.hpp"

#include "../bench_util.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using dopt::Tensor;
using namespace dopt::optim;

namespace {
struct Lost : std::runtime_error {
  Lost() : std::runtime_error("lost on purpose") {}
};
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
/// CPU time of this process (all threads, user + system), ms.
double process_cpu_ms() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt: ZeRO redundancy overhead and recovery time"};
  std::int64_t params = 50'000'000;
  std::int64_t tensors = 64;
  int ranks = 4;
  int steps = 5;
  int interval = 4;
  std::string recover_with = "replay";
  // Processes: one folder per dopt-run (its ranks share the port).
  const auto env = dopt::launch_env_from_environment();
  const bool procs = env.has_value();
  std::string dir = (fs::temp_directory_path() /
                     ("dopt-bench-survive-" + std::to_string(procs ? env->master_port : ::getpid())))
                        .string();
  app.add_option("--params", params, "float32 parameters in all")->check(CLI::PositiveNumber);
  app.add_option("--tensors", tensors, "parameter tensors")->check(CLI::PositiveNumber);
  app.add_option("--ranks", ranks, "simulated ranks")->check(CLI::Range(2, 64));
  app.add_option("--steps", steps, "timed blocks of --interval steps per measurement")->check(CLI::PositiveNumber);
  app.add_option("--interval", interval, "snapshot_interval of replay, and the steps per timed block")
      ->check(CLI::PositiveNumber);
  std::int64_t chunk = 65536;
  app.add_option("--chunk", chunk, "host_memory_chunk (--recover host_memory)")->check(CLI::PositiveNumber);
  app.add_option("--recover", recover_with, "how the buddies keep up in the recovery measurement")
      ->check(CLI::IsMember({"step", "replay", "host_memory"}));
  CLI11_PARSE(app, argc, argv);

  const auto sizes = dopt::bench::tensor_sizes(params, tensors, true);
  std::vector<double> step0, step1, train0, train1, copy, cpu0, cpu1, tcpu0, tcpu1, step2, train2, cpu2, tcpu2;
  std::int64_t buddy_bytes_step = 0, buddy_bytes_replay = 0;
  double recovery_ms = 0, next_ms = 0, restart_ms = 0, recovery_cpu_ms = 0, next_cpu_ms = 0, restart_cpu_ms = 0;
  std::atomic<std::int64_t> lost_at{0};  // simulated: the moment of the loss (steady clock)
  const std::string lost_file = dir + "/lost-at";  // processes: the same, written by the lost one
  dopt::RunOptions ro;
  ro.simulated_ranks = ranks;
  ro.runtime_options.collective_timeout = std::chrono::minutes(10);
  if (procs) ranks = env->world_size;
  auto make = [&] {
    std::vector<Tensor> ps;
    for (std::int64_t n : sizes) {
      ps.push_back(Tensor::full({n}, 0.5));
      ps.back().set_requires_grad(true);
      ps.back().set_grad(Tensor::full({n}, 0.01));
    }
    return ps;
  };
  try {
    dopt::run_distributed([&](dopt::RankContext& ctx) {
      dopt::ProcessGroup world = ctx.world();
      // CPU time since c0 of the ranks of g: simulated, this process's (every
      // rank's; read on rank 0), processes, the sum over them.
      auto cpu_since = [&](dopt::ProcessGroup& g, double c0) {
        const double mine = process_cpu_ms() - c0;
        if (!procs) return mine;
        Tensor t = Tensor::full({1}, mine, dopt::DType::float64);
        g.all_reduce(t, dopt::ReduceOp::sum);
        return t.data<double>()[0];
      };
      double cpu_ms = 0;  // rank 0: the process's CPU time over the last timed()
      auto timed = [&](dopt::ProcessGroup& g, const std::function<void()>& f) {
        g.barrier();
        const double c0 = process_cpu_ms();
        const auto t0 = Clock::now();
        f();
        const double ms = dopt::bench::slowest(g, {ms_since(t0)})[0];
        cpu_ms = cpu_since(g, c0);
        return ms;
      };
      // k: 0 redundancy 0, 1 redundancy 1 stepping every step, 2 redundancy 1 replaying.
      // The configuration the recovery is measured with runs last (the world breaks).
      // k 2 is host_memory instead of replay with --recover host_memory.
      const std::vector<int> ks = recover_with != "step" ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 2, 1};
      const ZeroBuddyUpdate alt = recover_with == "host_memory" ? ZeroBuddyUpdate::host_memory : ZeroBuddyUpdate::replay;
      // All configurations exist at once and their timed blocks alternate, so
      // that the machine's drift weighs on each alike.
      struct Cfg {
        int k;
        ZeroOptions zo;
        std::vector<Tensor> ps;
        std::unique_ptr<ZeroRedundancyOptimizer> zero;
      };
      std::vector<Cfg> cfgs;
      for (int k : ks) {
        Cfg c{k, ZeroOptions{world}, make(), nullptr};
        c.zo.parameters_as_bucket_view = true;
        c.zo.redundancy = k ? 1 : 0;
        c.zo.buddy_update = k == 2 ? alt : ZeroBuddyUpdate::step;
        c.zo.snapshot_interval = interval;
        c.zo.host_memory_chunk = chunk;
        c.zero = std::make_unique<ZeroRedundancyOptimizer>(c.ps, OptimizerSpec{"Adam", {}}, c.zo);
        // Warm-up: the state exists, blocks start after a snapshot, and with
        // replay the second snapshot has made the buffers the next ones reuse.
        for (int w = 0; w < 2 * interval; ++w) c.zero->step();
        cfgs.push_back(std::move(c));
      }
      for (int s = 0; s < steps; ++s)
        for (auto& c : cfgs) {
          const int k = c.k;
          auto& zero = *c.zero;
          const double a = timed(world, [&] {
                             for (int i = 0; i < interval; ++i) zero.step();
                           }) / interval;
          const double a_cpu = cpu_ms / interval;
          const double b = timed(world, [&] {
                             for (int i = 0; i < interval; ++i) {
                               // averaged: a sum would grow the gradients 4-fold per step
                               // (inf in exp_avg_sq after ~40 steps: load_sharded refuses it)
                               for (auto& p : c.ps) world.all_reduce(p.grad(), dopt::ReduceOp::avg);
                               zero.step();
                             }
                           }) / interval;
          const double b_cpu = cpu_ms / interval;
          if (ctx.rank() == 0) {
            (k == 2 ? step2 : k ? step1 : step0).push_back(a);
            (k == 2 ? cpu2 : k ? cpu1 : cpu0).push_back(a_cpu);
            (k == 2 ? tcpu2 : k ? tcpu1 : tcpu0).push_back(b_cpu);
            (k == 2 ? train2 : k ? train1 : train0).push_back(b);
          }
        }
      for (auto& c : cfgs) {
        const int k = c.k;
        auto& zero = *c.zero;
        const ZeroOptions& zo = c.zo;
        if (ctx.rank() == 0 && k == 1) buddy_bytes_step = zero.buddy_state_bytes();
        if (ctx.rank() == 0 && k == 2) buddy_bytes_replay = zero.buddy_state_bytes();
        if (k == 0) {  // the alternative: ship the shard's state (Adam: two moments) to the buddy every step
          const std::int64_t n = 2 * params / ranks;
          Tensor out = Tensor::full({n}, 1.0), in = Tensor::empty({n});
          for (int s = 0; s < steps; ++s) {
            const double c = timed(world, [&] {
              auto f = world.send_async(out, (ctx.rank() + 1) % ranks);
              world.recv(in, (ctx.rank() + ranks - 1) % ranks);
              f.get();
            });
            if (ctx.rank() == 0) copy.push_back(c);
          }
        }
        if (k == (recover_with != "step" ? 2 : 1)) {
          zero.save_sharded(dir);
          dopt::ProcessGroup survivors;
          world.barrier();
          const int victim = ranks - 1;
          auto probe_zero = [&](const char* point, std::int64_t step, int) {
            if (ctx.rank() == victim && std::string(point) == "computed" && step == interval - 1) {
              const auto now = Clock::now().time_since_epoch().count();
              if (!procs) {
                lost_at.store(now);
                throw Lost();
              }
              std::ofstream(lost_file) << now << std::endl;  // the steady clock is the host's
              ::kill(::getpid(), SIGKILL);
            }
          };
          // A second optimizer over the same parameters with the probe armed
          // (the options cannot change after construction).
          ZeroOptions zp{world};
          zp.parameters_as_bucket_view = true;
          zp.redundancy = 1;
          zp.buddy_update = zo.buddy_update;
          zp.snapshot_interval = interval;
          zp.host_memory_chunk = chunk;
          zp.probe = probe_zero;
          auto ps2 = make();
          ZeroRedundancyOptimizer z2(ps2, OptimizerSpec{"Adam", {}}, zp);
          for (int w = 0; w + 1 < interval; ++w) z2.step();  // the loss comes in step interval-1
          world.barrier();
          const double c_start = process_cpu_ms();
          try {  // a survivor's own failure would otherwise hide behind the lost rank's error
            try {
              z2.step();
            } catch (const MembershipChangedError& e) {
              std::int64_t at = lost_at.load();
              if (procs) std::ifstream(lost_file) >> at;
              const auto t_lost = Clock::time_point(Clock::duration(at));
              const double rec = std::chrono::duration<double, std::milli>(Clock::now() - t_lost).count();
              if (dopt::settings::flag("DOPT_ZERO_TRACE").value_or(false))
                std::fprintf(stderr, "dopt_bench_survive: rank %d lost at steady clock %lld ns\n", victim,
                             static_cast<long long>(at));
              survivors = e.recovery().group;
              survivors.barrier();  // every survivor recovered
              const double rec_cpu = cpu_since(survivors, c_start);
              z2.step();
              const double nxt = std::chrono::duration<double, std::milli>(Clock::now() - t_lost).count();
              const double next_cpu = cpu_since(survivors, c_start);
              const auto worst = dopt::bench::slowest(survivors, {rec, nxt});
              const double rs = timed(survivors, [&] {
                ZeroOptions zr{survivors};
                zr.parameters_as_bucket_view = true;
                auto ps3 = make();
                ZeroRedundancyOptimizer fresh(ps3, OptimizerSpec{"Adam", {}}, zr);
                fresh.load_sharded(dir);
                fresh.step();
              });
              if (survivors.rank() == 0) {
                recovery_ms = worst[0];
                recovery_cpu_ms = rec_cpu;
                next_cpu_ms = next_cpu;
                next_ms = worst[1];
                restart_ms = rs;
                restart_cpu_ms = cpu_ms;
              }
            }
          } catch (const std::exception& e) {  // run_distributed reports it with the lost rank's
            if (ctx.rank() != victim)
              std::fprintf(stderr, "dopt_bench_survive: rank %d: the recovery failed: %s\n", ctx.rank(), e.what());
            throw;
          }
        }
        c.zero.reset();  // its memory back before the next one's part
        c.ps.clear();
      }
    }, ro);
  } catch (const dopt::Error& e) {
    if (std::string(e.what()).find("lost on purpose") == std::string::npos) throw;
  }
  if (procs && env->rank != 0) return 0;
  fs::remove_all(dir);
  const double s0 = dopt::bench::median(step0), s1 = dopt::bench::median(step1);
  const double t0 = dopt::bench::median(train0), t1 = dopt::bench::median(train1);
  const double c0 = dopt::bench::median(cpu0), c1 = dopt::bench::median(cpu1);
  const double tc0 = dopt::bench::median(tcpu0), tc1 = dopt::bench::median(tcpu1);
  const double s2 = dopt::bench::median(step2), t2 = dopt::bench::median(train2);
  const double c2 = dopt::bench::median(cpu2), tc2 = dopt::bench::median(tcpu2);
  const std::string a = recover_with == "host_memory" ? "host_memory" : "replay";
  const char* an = a.c_str();
  std::printf("{\"ranks_are\": \"%s\", \"params\": %lld, \"tensors\": %lld, \"ranks\": %d, \"steps\": %d, "
              "\"interval\": %d, \"recover\": \"%s\", \"dev_shm_huge\": \"%s\", "
              "\"step_ms_%s\": %.1f, \"step_overhead_%s\": %.3f, \"step_cpu_ms_%s\": %.1f, "
              "\"step_cpu_overhead_%s\": %.3f, \"train_ms_%s\": %.1f, \"train_overhead_%s\": %.3f, "
              "\"train_cpu_ms_%s\": %.1f, \"train_cpu_overhead_%s\": %.3f, "
              "\"buddy_bytes_step\": %lld, \"buddy_bytes_%s\": %lld, "
              "\"step_ms_r0\": %.1f, \"step_ms_r1\": %.1f, \"step_overhead\": %.3f, "
              "\"step_cpu_ms_r0\": %.1f, \"step_cpu_ms_r1\": %.1f, \"step_cpu_overhead\": %.3f, "
              "\"train_ms_r0\": %.1f, \"train_ms_r1\": %.1f, \"train_overhead\": %.3f, "
              "\"train_cpu_ms_r0\": %.1f, \"train_cpu_ms_r1\": %.1f, \"train_cpu_overhead\": %.3f, \"shard_copy_ms\": %.1f, "
              "\"recovery_ms\": %.1f, \"kill_to_next_step_ms\": %.1f, \"restart_ms\": %.1f, "
              "\"recovery_cpu_ms\": %.1f, \"kill_to_next_step_cpu_ms\": %.1f, \"restart_cpu_ms\": %.1f}\n",
              procs ? "processes" : "simulated", static_cast<long long>(params), static_cast<long long>(tensors), ranks, steps,
              interval, recover_with.c_str(), dopt::shm::dev_shm_huge_mode().c_str(), an, s2, an, s2 / s0 - 1.0, an, c2, an, c2 / c0 - 1.0, an, t2, an,
              t2 / t0 - 1.0, an, tc2, an, tc2 / tc0 - 1.0, static_cast<long long>(buddy_bytes_step), an,
              static_cast<long long>(buddy_bytes_replay), s0, s1, s1 / s0 - 1.0, c0, c1, c1 / c0 - 1.0,
              t0, t1, t1 / t0 - 1.0, tc0, tc1, tc1 / tc0 - 1.0, dopt::bench::median(copy), recovery_ms, next_ms, restart_ms,
              recovery_cpu_ms, next_cpu_ms, restart_cpu_ms);
  return 0;
}
