// dopt_bench_sim wake: the network model's wake_latency, measured apart from
// any collective (bench/compare_network_model.py).
//
//   dopt_bench_sim wake [--iters 5000] [--cores 0,1]
//
// Two processes, each pinned to one of two cores, pass a turn back and forth
// through a word in shared memory; the one whose turn it is not sleeps on the
// word at once (a futex wait, no polling), as the shared-memory plane's
// waiters do once their spin is over, and the other wakes it. Prints one JSON
// line: {"benchmark": "sim_wake", "wake_us": the median of one hand-over
// (wake-up and the woken process running again), "min_us", "iters"}.
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <new>
#include <vector>

#include <CLI/CLI.hpp>

namespace {

struct Shared {
  alignas(64) std::atomic<std::uint32_t> turn{0};
  alignas(64) std::atomic<std::int64_t> stamp{0};  // when the turn was passed (steady clock, ns)
};

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::sched_setaffinity(0, sizeof set, &set);
}

/// Sleeps until `turn` differs from `seen`.
void wait_turn(std::atomic<std::uint32_t>& turn, std::uint32_t seen) {
  while (turn.load(std::memory_order_acquire) == seen)
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&turn), FUTEX_WAIT, seen, nullptr, nullptr, 0);
}

void pass(std::atomic<std::uint32_t>& turn) {
  turn.fetch_add(1, std::memory_order_acq_rel);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&turn), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

int sim_wake_main(int argc, char** argv) {
  CLI::App app{"dopt_bench_sim wake: a futex wake-up on another core (the network model's wake_latency)"};
  int iters = 5000;
  std::vector<int> cores{0, 1};
  app.add_option("--iters", iters, "hand-overs timed")->check(CLI::Range(10, 10000000));
  app.add_option("--cores", cores, "the two cores")->expected(2);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("dopt_bench_sim wake: mmap");
    return 1;
  }
  auto* sh = new (mem) Shared();
  const int warm = std::max(10, iters / 10);
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("dopt_bench_sim wake: fork");
    return 1;
  }
  // Turn t belongs to the parent when even, to the child when odd: its owner
  // stamps the time and passes it; the other, woken, measures from the stamp
  // (the parent's measurements are printed).
  const int me = child == 0 ? 1 : 0;
  pin(cores[static_cast<std::size_t>(me)]);
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::vector<double> took;
  const std::uint32_t total = 2u * static_cast<std::uint32_t>(warm + iters);
  for (std::uint32_t t = 0; t < total; ++t) {
    if (static_cast<int>(t % 2) != me) {  // the other's turn: sleep until it passes
      wait_turn(sh->turn, t);
      const double us = static_cast<double>(now_ns() - sh->stamp.load(std::memory_order_acquire)) / 1e3;
      if (t / 2 >= static_cast<std::uint32_t>(warm)) took.push_back(us);
      continue;
    }
    while (sh->turn.load(std::memory_order_acquire) != t) {
    }
    sh->stamp.store(now_ns(), std::memory_order_release);
    pass(sh->turn);
  }
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::sort(took.begin(), took.end());
  std::printf("{\"benchmark\": \"sim_wake\", \"wake_us\": %.2f, \"min_us\": %.2f, \"iters\": %zu, \"cores\": [%d, %d]}\n",
              took[took.size() / 2], took.front(), took.size(), cores[0], cores[1]);
  ::munmap(mem, sizeof(Shared));
  return 0;
}
