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
// In deterministic mode the ranks and the runtime's helpers for async calls
// and send/recv are tasks (each on its own stack, all on one OS thread: no
// thread per rank) that pass one baton: only its holder runs. Each collective, send/recv, future wait and
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
#include <cstddef>
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
/// Messages are counted per rank from 1: the protocol steps of its
/// collectives, its sends (each send is one message) and its RPC messages.
/// simulate() throws ValueError for a plan that cannot mean anything (a
/// rank outside the world, a probability outside [0, 1], a negative delay
/// or number, two faults of one kind for one rank, a partition with every
/// rank or none on one side); a number a rank never reaches does not fire.
struct FaultPlan {
  enum class Kind { crash, stop, delay, drop, fail_read, corrupt_read, partition };
  struct Fault {
    Kind kind = Kind::crash;
    int rank = 0;          // -1: any rank (delay only)
    int at = 0;            // the call (crash, stop) or message (drop) number; 0: chosen by the seed
    double probability = 0;                  // delay: the chance of each message
    std::chrono::milliseconds delay{0};      // delay: up to this much (drawn by the seed)
    std::string path;                        // reads: files whose path contains this
    std::vector<int> side;                   // partition: the ranks on one side
    std::chrono::milliseconds from{0};       // partition: from this virtual time on
  };
  std::vector<Fault> faults;
  /// Range of the call numbers drawn for `at == 0`.
  int random_call_limit = 20;

  /// Rank r's process dies at its k-th call (k = 0: a call in
  /// [1, random_call_limit] chosen by the seed): the call and everything
  /// after it never run, its peers' calls fail with PeerLostError naming it.
  FaultPlan& crash(int rank, int at_call = 0) {
    faults.push_back({Kind::crash, rank, at_call, 0, {}, {}, {}, {}});
    return *this;
  }
  /// Rank r stops (as SIGSTOP) at its k-th call: it neither progresses nor
  /// is declared lost, so its peers' calls end with TimeoutError after the
  /// group timeout (in virtual time: at once).
  FaultPlan& stop(int rank, int at_call = 0) {
    faults.push_back({Kind::stop, rank, at_call, 0, {}, {}, {}, {}});
    return *this;
  }
  /// Each protocol message of `rank` (-1: of every rank) is late with the
  /// given probability, by a virtual delay of up to max_delay.
  FaultPlan& delay_messages(int rank, double probability, std::chrono::milliseconds max_delay) {
    faults.push_back({Kind::delay, rank, 0, probability, max_delay, {}, {}, {}});
    return *this;
  }
  /// The k-th protocol message of rank r is lost (k = 0: drawn by the seed).
  /// When it is a send, the link from r to the receiver is lost with it: that
  /// send and every later one on the link fail with PeerLostError after
  /// their timeout, and so do the receiver's recvs of them.
  FaultPlan& drop_message(int rank, int at_message = 0) {
    faults.push_back({Kind::drop, rank, at_message, 0, {}, {}, {}, {}});
    return *this;
  }
  /// From virtual time `from` on, nothing crosses between the ranks in `side`
  /// and the other ranks: sends are lost as on a cut link (drop_message), RPC
  /// messages are lost, collectives across fail (docs/testing.md).
  FaultPlan& partition(std::vector<int> side, std::chrono::milliseconds from = std::chrono::milliseconds(0)) {
    faults.push_back({Kind::partition, -1, 0, 0, {}, {}, std::move(side), from});
    return *this;
  }
  /// The first checkpoint read (safetensors load) of a file whose path
  /// contains `path` fails with IOError / returns flipped bytes.
  FaultPlan& fail_read(std::string path) {
    faults.push_back({Kind::fail_read, -1, 0, 0, {}, std::move(path), {}, {}});
    return *this;
  }
  FaultPlan& corrupt_read(std::string path) {
    faults.push_back({Kind::corrupt_read, -1, 0, 0, {}, std::move(path), {}, {}});
    return *this;
  }
  bool empty() const noexcept { return faults.empty(); }
};

/// How many faults of each kind fired.
struct FaultCounts {
  std::uint64_t collective_delays = 0;  // protocol steps of collectives made late
  std::uint64_t p2p_delays = 0;         // sends made late
  std::uint64_t rpc_delays = 0;         // RPC messages made late
  std::uint64_t collective_drops = 0;   // protocol steps of collectives lost
  std::uint64_t p2p_drops = 0;          // sends lost: the dropped one and the later ones on its link
  std::uint64_t rpc_drops = 0;          // RPC messages lost
  std::uint64_t partitioned = 0;        // sends, RPC messages, collective calls lost to a partition
  std::uint64_t crashes = 0, stops = 0, read_faults = 0;
  std::uint64_t total() const noexcept {
    return collective_delays + p2p_delays + rpc_delays + collective_drops + p2p_drops + rpc_drops + partitioned +
           crashes + stops + read_faults;
  }
  bool operator==(const FaultCounts&) const = default;
};

namespace sim {

/// A network and hosts for the virtual time of a deterministic simulation
/// (SimulateOptions::network; docs/testing.md, "A network model"). Rank r
/// lives on host r / ranks_per_host (0: ceil(world size / hosts)). With it,
/// every collective and send advances its ranks' virtual time by the cost of
/// the algorithm the real planes run for that layout and size: one host, the
/// shared-memory plane between processes; several, the hierarchical plane.
struct NetworkModel {
  int hosts = 1;
  int ranks_per_host = 0;
  /// One message's latency between two hosts, end to end (from one rank's
  /// send to the other rank's receipt: the time of an exchange of a few
  /// bytes, as an 8-byte all_reduce between two ranks of two hosts takes),
  /// and each host's link rate (bytes/s of payload, each way; every host has
  /// one link to a switch).
  std::chrono::nanoseconds link_latency{20000};
  double link_bandwidth = 1.25e9;
  /// false: a wire (a message's latency and its bytes at the link's rate add
  /// up). true: a link shaped by a token bucket whose burst holds a latency's
  /// worth of bytes (tc tbf; a cloud NIC's rate limit): in back-to-back calls
  /// the bytes go while the latencies pass, and the larger of the two counts.
  bool link_shaped = false;
  /// Bytes read plus written per second by all cores of a host together;
  /// host_cache_bandwidth instead where what a host's members touch between
  /// two uses of a byte (their data and two chunks of buffer each) fits
  /// host_cache_bytes (0: no cache modelled).
  double host_memory_bandwidth = 2e10;
  double host_cache_bandwidth = 0;
  std::size_t host_cache_bytes = 0;
  int cores_per_host = 8;
  /// Every call, and every synchronisation of a host's members (a round).
  std::chrono::nanoseconds call_overhead{0};
  std::chrono::nanoseconds sync_latency{5000};
  /// How long the shared-memory plane's waiters poll before they sleep
  /// (DOPT_SHM_SPIN_US; `spin_past_cores` when a host's members outnumber its
  /// cores), and how long a member that slept takes to run again once the
  /// last member arrived (a futex wake-up on another core; 0: never sleeps).
  /// A wait past the spin (members past the cores unevenly: a phase; a recv:
  /// the copy) costs a wake-up per wave of members (ceil(members / cores)).
  std::chrono::nanoseconds spin{20000};
  std::chrono::nanoseconds spin_past_cores{2000};
  std::chrono::nanoseconds wake_latency{0};
  /// Bytes/s a core reads of what another core has just written and still
  /// holds in its own cache (a slice of at most core_cache_bytes / 4; 0:
  /// of at most shm_small_bytes), added to the cache's or memory's time,
  /// for the part written on other cores (0: not modelled).
  double exchange_bandwidth = 0;
  std::size_t core_cache_bytes = 0;
  /// The shared-memory plane's settings (ShmPlane::Options; DOPT_SHM_*).
  std::size_t shm_small_bytes = 32u << 10;
  std::size_t shm_buffer_bytes = 4u << 20;
  /// The TCP ring's (one member per host): an all_reduce of at most
  /// tcp_small_bytes, or of at most tcp_pair_bytes between two hosts, sends
  /// the whole buffer to every other host at once (the ring's defaults).
  std::size_t tcp_small_bytes = 64u << 10;
  std::size_t tcp_pair_bytes = 2u << 20;
};

}  // namespace sim

/// What one deterministic run did (filled when SimulateOptions::report is set;
/// successive simulate() calls with the same report accumulate).
struct SimReport {
  std::uint64_t seed = 0;
  /// Hash of the event trace: which thread ran at each scheduling point, at
  /// which virtual time, and why it stopped. Equal for two runs of a seed.
  std::uint64_t trace_hash = 0;
  std::uint64_t decisions = 0;           // scheduling points
  std::chrono::nanoseconds virtual_time{0};
  /// The faults that fired, in order: crashes, stops, drops, the first loss
  /// of each link to a partition, failed reads (delays are only counted).
  std::vector<std::string> faults;
  /// Every fault that fired, delays included, by kind.
  FaultCounts fired;
  /// The trace itself (one line per scheduling point), when
  /// SimulateOptions::keep_trace (for comparing two runs).
  std::vector<std::string> trace;
  /// With SimulateOptions::network: bytes each host sent on its link (index:
  /// host), and the virtual time the model's costs added (each call counted once).
  std::vector<std::uint64_t> link_bytes;
  std::chrono::nanoseconds modelled_time{0};
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

/// A fault plan from text, faults separated by ';' (ValueError naming the
/// bad part):  crash:R:K  stop:R:K  delay:R:P:MS  drop:R:K
/// partition:R,R,...@MS  fail_read:S  corrupt_read:S  (R -1: every rank for
/// delay; K 0: drawn by the seed; "@MS" optional). E.g.
/// "delay:-1:0.5:50;drop:1:3".
FaultPlan parse_faults(const std::string& spec);
/// DOPT_SIM_FAULTS, parsed: added to the fault plan of every deterministic
/// simulate() (how dopt-swarm injects faults into a program it runs).
std::optional<FaultPlan> env_faults();

/// Where two traces first differ ("" when equal).
std::string compare_traces(const SimReport& a, const SimReport& b);

/// "5 faults: 3 p2p delays, 2 p2p drops" ("0 faults" when none fired).
std::string describe(const FaultCounts& fired);

}  // namespace sim
}  // namespace dopt
