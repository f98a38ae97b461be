// dopt_bench_grow: how long a replacement takes from its start to its first
// training step, and what its join costs the other ranks (issue 45). Run under
// dopt-run --on-failure replace, every rank with DOPT_TRANSPORT=tcp (the actor
// plane) or whichever plane can take a replacement:
//
//   dopt-run --nproc-per-node 4 --on-failure replace dopt_bench_grow
//       [--params N] [--tensors K] [--steps S] [--kill-rank R] [--kill-at T]
//       [--compute-ms C] [--redundancy 1] [--copy-bytes B] [--copy-reps P]
//
// The ranks train a ZeroRedundancyOptimizer (Adam) over N float32 parameters
// in K tensors of even sizes. Each step: C ms of "compute" (a sleep, standing
// for forward and backward), a synthetic gradient written in place (the same
// on every rank; no gradient all-reduce), zero.step(). Rank R (not 0) kills
// itself with SIGKILL at the start of step T (300 ms after the step began, so
// that the others have seen step T-1 end). The others recover (redundancy 1:
// the lost shard comes back from its buddy copy; the step that sees the loss
// throws MembershipChangedError after recovering, or PeerLostError, then
// recover()) and go on over the shrunk group. dopt-run starts R's
// replacement, which init_process_group()s (rank 0 admits it to the job),
// allocates its tensors, join_group()s, builds its ZeRO and zero_catch_up()s.
// While shrunk, the members ask ProcessGroup::newcomers_waiting() at every
// step boundary (one broadcast from the lowest member, so all agree); once
// it is not 0 they grow() by that many, build a ZeRO over the grown group and
// zero_catch_up() from the old one,
// then step.
//
// Before training, ranks 0 and R measure the plane's point-to-point copy rate:
// P round trips of B bytes (send 0 -> R, send back), rate = 2 B / round trip,
// median over the round trips.
//
// Every line is one JSON object on stdout:
//   {"kind": "copy", ...}   rank 0: bytes, reps, median round trip, rate_bytes_per_s, peer
//   {"kind": "step", ...}   every rank, every step attempt: rank, incarnation, step, start, end
//                           (CLOCK_REALTIME seconds), group_size, recovered (the step saw the
//                           loss: MembershipChangedError, or PeerLostError and recover()),
//                           grew, grow_s, catch_up_s
//   {"kind": "kill", ...}   the victim just before SIGKILL: rank, step, time
//   {"kind": "join", ...}   the replacement after its first step: proc_start (from
//                           /proc/self/stat, 10 ms ticks), main_start, init_done (rank 0
//                           admitted it then), allocated (its parameters and gradients), joined,
//                           caught_up, first_step_end (CLOCK_REALTIME seconds),
//                           bytes_received (the parameters plus the optimizer state it
//                           holds after the catch-up: owned and buddy copies), step
//   {"kind": "done", ...}   every rank at the end: rank, incarnation, steps, group_size
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/recovery.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/launch_env.hpp"
#include "dopt/runtime/settings.hpp"

namespace {

using dopt::ProcessGroup;
using dopt::Tensor;
using dopt::optim::ZeroOptions;
using dopt::optim::ZeroRedundancyOptimizer;

double realtime_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// This process's start in CLOCK_REALTIME seconds: /proc/self/stat's start
/// time (clock ticks since boot) against CLOCK_BOOTTIME now; -1 if unreadable.
double process_start_realtime() {
  std::ifstream in("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = all.rfind(')');
  if (paren == std::string::npos) return -1.0;
  std::istringstream rest(all.substr(paren + 2));
  std::string field;
  // Fields 3 .. 22 (1-based, as proc(5) counts); 22 is starttime.
  for (int f = 3; f < 22; ++f) rest >> field;
  unsigned long long start_ticks = 0;
  if (!(rest >> start_ticks)) return -1.0;
  timespec boot{};
  clock_gettime(CLOCK_BOOTTIME, &boot);
  const double since_boot = static_cast<double>(boot.tv_sec) + 1e-9 * static_cast<double>(boot.tv_nsec);
  const double age = since_boot - static_cast<double>(start_ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return realtime_now() - age;
}

struct Options {
  std::int64_t params = 50'000'000;
  std::int64_t tensors = 100;
  std::int64_t steps = 10;
  int kill_rank = -1;  // default: the last rank
  std::int64_t kill_at = 3;
  int compute_ms = 200;
  int redundancy = 1;
  std::int64_t copy_bytes = 64 << 20;
  int copy_reps = 5;
};

/// Rank 0 and `peer` time reps round trips of `bytes`; rank 0 prints the copy line.
void measure_copy(ProcessGroup& world, int peer, const Options& o) {
  const int me = world.rank();
  if (me != 0 && me != peer) return;
  Tensor buf = Tensor::full({o.copy_bytes / 4}, 1.0);
  std::vector<double> rtt;
  for (int k = 0; k < o.copy_reps + 1; ++k) {  // the first round trip warms the connections up
    const auto t0 = std::chrono::steady_clock::now();
    if (me == 0) {
      world.send(buf, peer, 7);
      world.recv(buf, peer, 8);
    } else {
      world.recv(buf, 0, 7);
      world.send(buf, 0, 8);
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (k > 0) rtt.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  if (me == 0) {
    const double m = dopt::bench::median(rtt);
    std::printf(
        "{\"kind\": \"copy\", \"bytes\": %lld, \"reps\": %d, \"median_round_trip_s\": %.6f, "
        "\"min_round_trip_s\": %.6f, \"rate_bytes_per_s\": %.1f, \"peer\": %d}\n",
        static_cast<long long>(o.copy_bytes), o.copy_reps, m, *std::min_element(rtt.begin(), rtt.end()),
        2.0 * static_cast<double>(o.copy_bytes) / m, peer);
    std::fflush(stdout);
  }
}

ZeroOptions zero_options(const ProcessGroup& g, const Options& o) {
  ZeroOptions zo{g};
  zo.redundancy = o.redundancy;
  return zo;
}

/// What zero_catch_up moves over the grown group (zero_grow.cpp): each
/// parameter's Adam moments (8 bytes an element) from its owner in `before`
/// to each of its keepers in `after` (owner and buddies) other than that
/// owner, and every parameter from the lowest member to each newcomer.
struct Traffic {
  std::int64_t total = 0;
  std::int64_t max_into_one = 0;
};

Traffic catch_up_traffic(const ZeroRedundancyOptimizer& before, const ZeroRedundancyOptimizer& after,
                         const std::vector<Tensor>& params, const dopt::GrowResult& grown) {
  const ProcessGroup& old_g = before.process_group();
  const ProcessGroup& new_g = grown.group;
  const auto was = before.param_owners();
  const auto now = after.param_owners();
  std::vector<std::int64_t> into(static_cast<std::size_t>(new_g.size()), 0);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int from = old_g.global_rank(was[i]);
    std::vector<int> keepers = {now[i]};
    for (int b : after.buddies(now[i])) keepers.push_back(b);
    for (int k : keepers)
      if (new_g.global_rank(k) != from) into[static_cast<std::size_t>(k)] += 8 * params[i].numel();
  }
  std::int64_t param_bytes = 0;
  for (const auto& p : params) param_bytes += static_cast<std::int64_t>(p.nbytes());
  for (int j : grown.joined) into[static_cast<std::size_t>(new_g.group_rank(j))] += param_bytes;
  Traffic t;
  for (auto b : into) {
    t.total += b;
    t.max_into_one = std::max(t.max_into_one, b);
  }
  return t;
}

dopt::optim::OptimizerSpec spec() { return dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}}; }

int run(const Options& o, double main_start) {
  auto env = dopt::launch_env_from_environment();
  if (!env) {
    std::fprintf(stderr, "dopt_bench_grow: not launched (run it under dopt-run --on-failure replace)\n");
    return 2;
  }
  const bool newcomer = dopt::settings::integer("DOPT_REPLACES").has_value();
  const long long incarnation = dopt::settings::integer("DOPT_INCARNATION").value_or(0);
  const int me = env->rank;
  const int n = env->world_size;
  const int victim = o.kill_rank >= 0 ? o.kill_rank : n - 1;
  if (victim == 0 || victim >= n) {
    std::fprintf(stderr, "dopt_bench_grow: --kill-rank must be 1 .. %d (rank 0 cannot be replaced)\n", n - 1);
    return 2;
  }
  const double proc_start = newcomer ? process_start_realtime() : -1.0;

  dopt::Runtime rt(dopt::RuntimeOptions::from_env());
  ProcessGroup world = dopt::init_process_group(rt, *env);
  const double init_done = realtime_now();

  // A replacement waits from here on (rank 0 admitted it); it allocates its
  // tensors while the members finish their step.
  const auto sizes = dopt::bench::tensor_sizes(o.params, o.tensors, /*torch_like=*/false);
  std::vector<Tensor> params;
  for (std::int64_t s : sizes) {
    params.push_back(Tensor::full({s}, 0.5));
    params.back().set_grad(Tensor::zeros({s}));
  }
  auto write_grads = [&](std::int64_t t) {
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i].grad().fill_(1e-3 * static_cast<double>((t + static_cast<std::int64_t>(i)) % 7 + 1));
  };

  ProcessGroup g = world;
  std::unique_ptr<ZeroRedundancyOptimizer> zero;
  double allocated = -1.0, joined = -1.0, caught_up = -1.0;
  std::int64_t bytes_received = 0;
  if (newcomer) {
    allocated = realtime_now();
    auto grown = world.join_group();
    joined = realtime_now();
    g = grown.group;
    zero = std::make_unique<ZeroRedundancyOptimizer>(params, spec(), zero_options(g, o));
    dopt::optim::zero_catch_up(*zero, nullptr, grown);
    caught_up = realtime_now();
    for (const auto& p : params) bytes_received += static_cast<std::int64_t>(p.nbytes());
    bytes_received += zero->local_state_bytes() + zero->buddy_state_bytes();
  } else {
    measure_copy(world, victim, o);
    zero = std::make_unique<ZeroRedundancyOptimizer>(params, spec(), zero_options(g, o));
  }

  bool first = newcomer;
  while (zero->step_count() < o.steps) {
    const std::int64_t t = zero->step_count();
    const double start = realtime_now();
    bool grew = false, recovered = false;
    double grow_s = 0, catch_up_s = 0;
    Traffic moved;
    if (!newcomer && g.size() < n) {
      if (const int waiting = g.newcomers_waiting(); waiting > 0) {
        const double a = realtime_now();
        auto grown = g.grow({.newcomers = waiting});
        const double b = realtime_now();
        auto bigger = std::make_unique<ZeroRedundancyOptimizer>(params, spec(), zero_options(grown.group, o));
        moved = catch_up_traffic(*zero, *bigger, params, grown);
        dopt::optim::zero_catch_up(*bigger, zero.get(), grown);
        zero = std::move(bigger);
        g = grown.group;
        grow_s = b - a;
        catch_up_s = realtime_now() - b;
        grew = true;
      }
    }
    try {
      if (me == victim && !newcomer && t == o.kill_at) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        std::printf("{\"kind\": \"kill\", \"rank\": %d, \"step\": %lld, \"time\": %.6f}\n", me,
                    static_cast<long long>(t), realtime_now());
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(o.compute_ms));
      write_grads(t);
      zero->step();
    } catch (const dopt::optim::MembershipChangedError& e) {
      // The loss was seen within the step: it recovered (the step completed or not: recovery().step_completed).
      g = e.recovery().group;
      recovered = true;
    } catch (const dopt::PeerLostError&) {
      auto r = zero->recover();
      g = r.group;
      recovered = true;
    }
    const double end = realtime_now();
    std::printf(
        "{\"kind\": \"step\", \"rank\": %d, \"incarnation\": %lld, \"step\": %lld, \"start\": %.6f, \"end\": %.6f, "
        "\"group_size\": %d, \"recovered\": %s, \"grew\": %s, \"grow_s\": %.6f, \"catch_up_s\": %.6f, "
        "\"catch_up_bytes_total\": %lld, \"catch_up_bytes_max_into_one\": %lld}\n",
        me, incarnation, static_cast<long long>(t), start, end, g.size(), recovered ? "true" : "false",
        grew ? "true" : "false", grow_s, catch_up_s, static_cast<long long>(moved.total),
        static_cast<long long>(moved.max_into_one));
    if (first && !recovered) {
      first = false;
      std::printf(
          "{\"kind\": \"join\", \"rank\": %d, \"incarnation\": %lld, \"proc_start\": %.6f, \"main_start\": %.6f, "
          "\"init_done\": %.6f, \"allocated\": %.6f, \"joined\": %.6f, \"caught_up\": %.6f, \"first_step_end\": %.6f, "
          "\"bytes_received\": %lld, \"step\": %lld, \"params\": %lld}\n",
          me, incarnation, proc_start, main_start, init_done, allocated, joined, caught_up, end,
          static_cast<long long>(bytes_received), static_cast<long long>(t), static_cast<long long>(o.params));
    }
    std::fflush(stdout);
  }
  g.barrier();
  std::printf("{\"kind\": \"done\", \"rank\": %d, \"incarnation\": %lld, \"steps\": %lld, \"group_size\": %d}\n", me,
              incarnation, static_cast<long long>(zero->step_count()), g.size());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const double main_start = realtime_now();
  CLI::App app{"dopt: time from a replacement's start to its first step (issue 45)"};
  Options o;
  app.add_option("--params", o.params, "float32 parameters in all")->check(CLI::PositiveNumber);
  app.add_option("--tensors", o.tensors, "parameter tensors (even sizes)")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "steps to train")->check(CLI::PositiveNumber);
  app.add_option("--kill-rank", o.kill_rank, "the rank that kills itself (default: the last)");
  app.add_option("--kill-at", o.kill_at, "the step at whose start it does")->check(CLI::NonNegativeNumber);
  app.add_option("--compute-ms", o.compute_ms, "fixed compute time per step (a sleep)")->check(CLI::NonNegativeNumber);
  app.add_option("--redundancy", o.redundancy, "ZeRO redundancy (1: the lost shard has a buddy copy)")
      ->check(CLI::Range(1, 4));
  app.add_option("--copy-bytes", o.copy_bytes, "bytes of the copy-rate round trips")->check(CLI::PositiveNumber);
  app.add_option("--copy-reps", o.copy_reps, "timed round trips")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (o.tensors > o.params || o.copy_bytes % 4 != 0 || o.kill_at >= o.steps - 1) {
    std::fprintf(stderr,
                 "dopt_bench_grow: need --tensors <= --params, --copy-bytes a multiple of 4, "
                 "--kill-at < --steps - 1\n");
    return 2;
  }
  try {
    return run(o, main_start);
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "dopt_bench_grow: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_grow: %s\n", e.what());
    return 1;
  }
}
