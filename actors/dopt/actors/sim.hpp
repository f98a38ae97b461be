#pragma once
// Deterministic simulation of distributed code: seeded schedules, virtual
// time, injected faults, replay from a seed, and a swarm of seeds.
//
//   dopt::SimulateOptions o;
//   o.deterministic = true;          // one rank thread runs at a time
//   o.seed = 42;                     // the schedule (and random faults) of this run
//   o.faults.crash(1, 3);            // rank 1 crashes at its 3rd collective
//   dopt::simulate(3, fn, o);
//
// In deterministic mode the threads of a simulation (the ranks' threads and
// the runtime's helper threads for async calls and send/recv) pass one
// baton: only its holder runs. Each collective, send/recv, future wait and
// protocol step is a scheduling point where a generator seeded with `seed`
// picks which runnable thread goes next. Time is virtual: when every thread
// waits, the clock jumps to the earliest deadline, so timeouts fire at once
// and in order. The same seed gives the same schedule, the same faults and
// the same results, run after run (as long as fn itself does not depend on
// real time or on threads of its own).
//
// Contracts:
//   * DOPT_SIM_SEED=s in the environment makes every simulate() call
//     deterministic with seed s (replay of a failing seed).
//   * A failing deterministic run prints its seed to stderr:
//     "dopt simulate: seed s failed: ...; replay with DOPT_SIM_SEED=s".
//   * fn must not block on anything but dopt (collectives, send/recv,
//     futures): a wait the scheduler cannot see (a mutex held across a
//     collective, a thread of fn's own) deadlocks the simulation; the
//     scheduler reports a wait on which nothing can progress as a
//     StateError naming the waiting threads.
//   * Only the shared-memory plane (the default) runs deterministically;
//     plane "actor" (and DOPT_PLANE=actor) with deterministic is a ValueError.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dopt {

struct SimulateOptions;

/// Faults injected into a deterministic simulation. Calls are counted per
/// rank from 1: every collective, send and recv the rank's code starts.
/// Crashes and stops happen on the rank's own thread: when the k-th call
/// comes from a helper thread (ZeRO's overlap worker), at the rank's next one.
struct FaultPlan {
  enum class Kind { crash, stop, delay, drop, fail_read, corrupt_read };
  struct Fault {
    Kind kind = Kind::crash;
    int rank = 0;          // -1: any rank (delay / drop)
    int at = 0;            // the call (crash, stop) or message (drop) number; 0: chosen by the seed
    double probability = 0;                  // delay: the chance of each message
    std::chrono::milliseconds delay{0};      // delay: up to this much (drawn by the seed)
    std::string path;                        // reads: files whose path contains this
  };
  std::vector<Fault> faults;
  /// Range of the call numbers drawn for `at == 0`.
  int random_call_limit = 20;

  /// Rank r's process dies at its k-th call (k = 0: a call in
  /// [1, random_call_limit] chosen by the seed): the call and everything
  /// after it never run, its peers' calls fail with PeerLostError naming it.
  FaultPlan& crash(int rank, int at_call = 0) {
    faults.push_back({Kind::crash, rank, at_call, 0, {}, {}});
    return *this;
  }
  /// Rank r stops (as SIGSTOP) at its k-th call: it neither progresses nor
  /// is declared lost, so its peers' calls end with TimeoutError after the
  /// group timeout (in virtual time: at once).
  FaultPlan& stop(int rank, int at_call = 0) {
    faults.push_back({Kind::stop, rank, at_call, 0, {}, {}});
    return *this;
  }
  /// Each protocol message of `rank` (-1: of every rank) is late with the
  /// given probability, by a virtual delay of up to max_delay.
  FaultPlan& delay_messages(int rank, double probability, std::chrono::milliseconds max_delay) {
    faults.push_back({Kind::delay, rank, 0, probability, max_delay, {}});
    return *this;
  }
  /// The k-th protocol message of rank r is lost (k = 0: drawn by the seed).
  FaultPlan& drop_message(int rank, int at_message = 0) {
    faults.push_back({Kind::drop, rank, at_message, 0, {}, {}});
    return *this;
  }
  /// The first checkpoint read (safetensors load) of a file whose path
  /// contains `path` fails with IOError / returns flipped bytes.
  FaultPlan& fail_read(std::string path) {
    faults.push_back({Kind::fail_read, -1, 0, 0, {}, std::move(path)});
    return *this;
  }
  FaultPlan& corrupt_read(std::string path) {
    faults.push_back({Kind::corrupt_read, -1, 0, 0, {}, std::move(path)});
    return *this;
  }
  bool empty() const noexcept { return faults.empty(); }
};

/// What one deterministic run did (filled when SimulateOptions::report is set;
/// successive simulate() calls with the same report accumulate).
struct SimReport {
  std::uint64_t seed = 0;
  /// Hash of the event trace: which thread ran at each scheduling point, at
  /// which virtual time, and why it stopped. Equal for two runs of a seed.
  std::uint64_t trace_hash = 0;
  std::uint64_t decisions = 0;           // scheduling points
  std::chrono::nanoseconds virtual_time{0};
  std::vector<std::string> faults;       // the faults that fired, in order
  /// The trace itself (one line per scheduling point), when
  /// SimulateOptions::keep_trace (for comparing two runs).
  std::vector<std::string> trace;
};

namespace sim {

struct SwarmOptions {
  std::uint64_t first_seed = 1;
  /// At most this many seeds...
  int seeds = 100;
  /// ...and no new seed after this much real time.
  std::chrono::milliseconds budget{10000};
  /// Runs every seed twice and compares the traces (a difference is a failure).
  bool check_determinism = true;
  /// Prints the failing seed and how to replay it to stderr.
  bool print = true;
};

struct SwarmResult {
  int tried = 0;
  std::optional<std::uint64_t> failing_seed;
  /// What failed: the exception's message, or where two runs of the seed diverged.
  std::string failure;
  bool nondeterministic = false;
};

/// Runs body(options) for seeds first_seed, first_seed + 1, ... with
/// options.deterministic, options.seed and options.report set, until one
/// throws (or, with check_determinism, two runs of it differ), `seeds` ran,
/// or `budget` is spent. body runs one simulation (or several) and checks
/// their results, throwing on a wrong one. DOPT_SIM_SEED=s runs only seed s.
SwarmResult swarm(const std::function<void(const SimulateOptions&)>& body, const SwarmOptions& options,
                  const SimulateOptions& base);
SwarmResult swarm(const std::function<void(const SimulateOptions&)>& body, const SwarmOptions& options = {});

/// The seed DOPT_SIM_SEED asks for, if set (ValueError when not a number).
std::optional<std::uint64_t> env_seed();

/// Where two traces first differ ("" when equal).
std::string compare_traces(const SimReport& a, const SimReport& b);

}  // namespace sim
}  // namespace dopt
