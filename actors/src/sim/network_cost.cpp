// The cost formulas of the network model (network_cost.hpp).
#include "sim/network_cost.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

#include "dopt/actors/internal/ring.hpp"
#include "plane/shm_one_round.hpp"

namespace dopt::detail::sim {

namespace {

using dopt::sim::NetworkModel;

// The model's defaults for the TCP ring's latency path are the ring's own.
static_assert(NetworkModel{}.tcp_small_bytes == RingOptions{}.small_bytes &&
              NetworkModel{}.tcp_pair_bytes == RingOptions{}.pair_bytes);

std::int64_t ns_of(double seconds) { return static_cast<std::int64_t>(std::llround(seconds * 1e9)); }

/// Seconds for one member's traffic (bytes read + written) while k members
/// of a host move theirs at once: `tensor` bytes on its own tensors (`data`
/// bytes of them), `written` and `read` bytes on the shared-memory buffers
/// (chunks of up to shm_buffer_bytes). Calls and chunks come back to the
/// same bytes in turn, so all of it goes at the cache's bandwidth when
/// everything the members touch between two uses of a byte fits the cache,
/// else at the memory's: k times the data and two chunks (each member has
/// two buffers, and rounds alternate between them). Each member gets its
/// bandwidth over max(k, cores): one core's share, and members past the
/// cores take turns.
double memory_s(const NetworkModel& m, double tensor, double written, double read, int k, double data) {
  if (k <= 0) return 0;
  const double chunk = std::min(data, static_cast<double>(m.shm_buffer_bytes));
  const bool cached = m.host_cache_bytes > 0 && m.host_cache_bandwidth > 0 &&
                      k * (data + 2 * chunk) <= static_cast<double>(m.host_cache_bytes);
  const double rate = cached ? m.host_cache_bandwidth : m.host_memory_bandwidth;
  return (tensor + written + read) / rate * std::max(k, std::max(1, m.cores_per_host));
}

/// Seconds for k members of a host that each read `remote` bytes the others
/// have just written, in slices of `slice` bytes, past the cache's or
/// memory's time: the part written on other cores at the exchange rate,
/// while a slice still sits in its writer's core's own cache (the writer's
/// next phase, about four slices of traffic, fits it: a slice of at most
/// core_cache_bytes / 4; unknown: the one-round path's data only). All of
/// it while the members have a core each; past the cores, the members that
/// share a reader's core wrote theirs on it. Members past the cores take
/// turns, as in memory_s.
double exchange_s(const NetworkModel& m, double remote, double slice, int k) {
  if (!(m.exchange_bandwidth > 0) || k <= 0) return 0;
  const double fits = static_cast<double>(m.core_cache_bytes > 0 ? m.core_cache_bytes / 4 : m.shm_small_bytes);
  if (slice > fits) return 0;
  const int cores = std::max(1, m.cores_per_host);
  const double others = k > cores ? static_cast<double>(k - (k + cores - 1) / cores) / (k - 1) : 1.0;
  return remote * others / m.exchange_bandwidth * std::max(k, cores) / cores;
}

double latency_s(const NetworkModel& m) { return std::chrono::duration<double>(m.link_latency).count(); }

/// Seconds of `hops` latencies and `bytes` through a host's link: on a wire
/// they add up; on a shaped link (a token bucket) the bytes of back-to-back
/// calls go while the previous call's latencies pass, so the larger counts.
double link_s(const NetworkModel& m, double hops, double bytes) {
  const double lat = hops * latency_s(m), wire = bytes / m.link_bandwidth;
  return m.link_shaped ? std::max(lat, wire) : lat + wire;
}
double sync_s(const NetworkModel& m) { return std::chrono::duration<double>(m.sync_latency).count(); }

/// Seconds of `syncs` synchronisations of k members of a host, each after a
/// phase of one member's own work of `phase` seconds: sync_latency each, and
/// a wake-up for each wave of members that run at once when the first
/// arrivals wait longer than they poll (then they sleep). How long they
/// wait: when the work is `symmetric` (every member does the same at once)
/// and the members have a core each, or outnumber the cores by a whole
/// number of times (the members sharing a core hand it to each other: a
/// waiter yields before it sleeps, and the member it yields to arrives a
/// phase later, as do those of the other cores), nothing; when they
/// outnumber them unevenly, the cores with fewer members finish a phase
/// earlier and their members sleep (they poll spin_past_cores); else (a
/// sender's copy, a broadcast root's staging) they wait for the phase (they
/// poll spin).
double syncs_s(const NetworkModel& m, double syncs, double phase, int k, bool symmetric = true) {
  const int cores = std::max(1, m.cores_per_host);
  const bool past = k > cores;
  const bool even = symmetric && k % cores == 0;
  const double wait = even ? 0.0 : past || !symmetric ? phase : 0.0;
  const double spin = std::chrono::duration<double>(past ? m.spin_past_cores : m.spin).count();
  const double waves = std::ceil(static_cast<double>(k) / cores);
  const double wake = wait > spin ? waves * std::chrono::duration<double>(m.wake_latency).count() : 0.0;
  return syncs * (sync_s(m) + wake);
}

/// One member's own time of a traffic that takes k members `seconds` in all
/// (memory_s's time without the turns of the members past the cores).
double own_of(const NetworkModel& m, double seconds, int k) {
  const int cores = std::max(1, m.cores_per_host);
  return seconds * cores / std::max(k, cores);
}

double own_s(const NetworkModel& m, double tensor, double written, double read, int k, double data) {
  return own_of(m, memory_s(m, tensor, written, read, k, data), k);
}

double chunks(const NetworkModel& m, double bytes) {
  return std::max(1.0, std::ceil(bytes / static_cast<double>(m.shm_buffer_bytes)));
}

/// The shared-memory plane between n processes of one host.
double shm_s(const NetworkModel& m, CollKind kind, double b, int n) {
  if (n <= 1) return 0;
  switch (kind) {
    case CollKind::all_reduce:
    case CollKind::all_reduce_coalesced:
    case CollKind::reduce:
      // small: stage B, reduce n x B into B (tensor: B read, B written;
      // buffers: B written, n B read); staged: per chunk a stage of the
      // others' slices, a reduce of one slice over n buffers, a copy of the
      // others' slices out, two synchronisations (tensor: 2 B; buffers:
      // B written, 2 (n - 1) / n B read).
      // Each synchronisation follows a phase of about half a chunk's work
      // (small: the staging, B on each side). The small round's reduce
      // reads the (n - 1) B the others just staged (exchange_s, slices of B).
      if (b <= static_cast<double>(m.shm_small_bytes) && b <= static_cast<double>(m.shm_buffer_bytes) &&
          b * n <= static_cast<double>(shm_plane::kOneRoundSmallCalls * m.shm_small_bytes))
        return syncs_s(m, 1, own_s(m, b, b, 0, n, b), n) + memory_s(m, 2 * b, b, n * b, n, b) +
               exchange_s(m, (n - 1) * b, b, n);
      {
        // the staged reads of the others' slices: 2 (n - 1) / n B, slices of a chunk's 1 / n
        const double c = chunks(m, b), slice = std::min(b, static_cast<double>(m.shm_buffer_bytes)) / n;
        const double mem =
            memory_s(m, 2 * b, b, 2.0 * (n - 1) / n * b, n, b) + exchange_s(m, 2.0 * (n - 1) / n * b, slice, n);
        return syncs_s(m, 2 * c, own_of(m, mem, n) / (2 * c), n) + mem;
      }
    case CollKind::reduce_scatter:
      return shm_s(m, CollKind::all_reduce, b * n, n);
    case CollKind::broadcast:
    case CollKind::broadcast_coalesced: {
      // the root stages, the others copy out
      const double c = chunks(m, b);
      // (the others read the root's chunks: exchange_s)
      const double root = memory_s(m, b, b, 0, 1, b);
      const double out = memory_s(m, b, 0, b, n - 1, b) +
                         exchange_s(m, b, std::min(b, static_cast<double>(m.shm_buffer_bytes)), n - 1);
      return syncs_s(m, 2 * c, own_of(m, root, 1) / c, n, false) + root + out;
    }
    case CollKind::all_gather:
    case CollKind::all_gather_flat: {
      // each stages its input, then copies all n inputs out (the others': exchange_s)
      const double c = chunks(m, b * n), t = b * (n + 1);
      const double slice = std::min(b, static_cast<double>(m.shm_buffer_bytes) / n);
      const double mem = memory_s(m, t, b, n * b, n, t) + exchange_s(m, (n - 1) * b, slice, n);
      return syncs_s(m, 2 * c, own_of(m, mem, n) / (2 * c), n) + mem;
    }
    default:
      return sync_s(m);  // barrier, new_group
  }
}

/// The hierarchical plane across H hosts with up to L members on each:
/// (seconds, the bytes each host sends per byte of b, the root host's factor).
struct Cross {
  double s = 0;
  std::vector<double> factor;  // per host (of the H involved, in order)
};

Cross hier(const NetworkModel& m, CollKind kind, double b, int H, int L, int root_host) {
  Cross x;
  x.factor.assign(static_cast<std::size_t>(H), 0.0);
  switch (kind) {
    case CollKind::reduce_scatter:
      return hier(m, CollKind::all_reduce, b * L * H, H, L, root_host);
    case CollKind::all_reduce:
    case CollKind::all_reduce_coalesced:
    case CollKind::reduce:
      if (L == 1) {
        // the TCP ring's latency path (RingOptions' small_bytes, and pair_bytes
        // between two hosts): every host sends b to every other at once, one
        // latency; else reduce-scatter then all-gather, 2(H-1) steps of b/H
        if (b <= static_cast<double>(m.tcp_small_bytes) || (H == 2 && b <= static_cast<double>(m.tcp_pair_bytes))) {
          for (auto& f : x.factor) f = H - 1;
          x.s = link_s(m, 1, (H - 1) * b);
          return x;
        }
        for (auto& f : x.factor) f = 2.0 * (H - 1) / H;
        x.s = link_s(m, 2 * (H - 1), 2.0 * (H - 1) / H * b);
        return x;
      }
      // per chunk: a chain of accumulators through the hosts (H - 1 hops),
      // then the last host sends the result to every other host (one hop);
      // the chunks follow each other on full-duplex links, so the busiest
      // direction bounds: the last host's (H - 1) B out
      for (int h = 0; h + 1 < H; ++h) x.factor[static_cast<std::size_t>(h)] = 1;
      x.factor.back() = H - 1;
      x.s = link_s(m, chunks(m, b) * H, (H - 1) * b);
      return x;
    case CollKind::broadcast:
    case CollKind::broadcast_coalesced:
      x.factor[static_cast<std::size_t>(root_host)] = H - 1;
      x.s = link_s(m, chunks(m, b), (H - 1) * b);
      return x;
    case CollKind::all_gather:
    case CollKind::all_gather_flat:
      for (auto& f : x.factor) f = static_cast<double>(H - 1) * L;
      x.s = link_s(m, 1, static_cast<double>(H - 1) * L * b);
      return x;
    default:
      x.s = link_s(m, 1, 0);
      return x;  // barrier, new_group: one exchange between the hosts
  }
}

}  // namespace

int host_of(const NetworkModel& m, int world_size, int r) {
  const int hosts = std::max(1, m.hosts);
  const int per = m.ranks_per_host > 0 ? m.ranks_per_host : (world_size + hosts - 1) / hosts;
  return std::min(hosts - 1, r / std::max(1, per));
}

CallCost collective_cost(const NetworkModel& m, int world_size, CollKind kind, std::size_t bytes,
                         const std::vector<int>& members, int root) {
  std::map<int, int> per_host;  // host: its members in the call
  for (int r : members) ++per_host[host_of(m, world_size, r)];
  int L = 0;
  for (const auto& [h, k] : per_host) L = std::max(L, k);
  const int H = static_cast<int>(per_host.size());
  const double b = static_cast<double>(bytes);
  double s = std::chrono::duration<double>(m.call_overhead).count() + shm_s(m, kind, b, L);
  CallCost c;
  if (H > 1) {
    const int rh = root >= 0 ? host_of(m, world_size, root) : per_host.begin()->first;
    const auto at = per_host.find(rh);
    const int root_host = at == per_host.end() ? 0 : static_cast<int>(std::distance(per_host.begin(), at));
    const Cross x = hier(m, kind, b, H, L, root_host);
    s += x.s;
    c.link_bytes.assign(static_cast<std::size_t>(std::max(1, m.hosts)), 0);
    int i = 0;
    for (const auto& [h, k] : per_host)
      c.link_bytes[static_cast<std::size_t>(h)] =
          static_cast<std::uint64_t>(std::llround(x.factor[static_cast<std::size_t>(i++)] * b));
  }
  c.ns = ns_of(s);
  return c;
}

CallCost send_cost(const NetworkModel& m, int world_size, std::size_t bytes, int src, int dst) {
  const double b = static_cast<double>(bytes);
  double s = std::chrono::duration<double>(m.call_overhead).count();
  CallCost c;
  const int hs = host_of(m, world_size, src);
  if (hs == host_of(m, world_size, dst)) {
    // into the mailbox and out (or one cross-memory read); the receiver waits for the sender's copy
    s += syncs_s(m, 1, own_s(m, b, b, 0, 1, b), 2, false) + memory_s(m, b, b, 0, 1, b) + exchange_s(m, b, b, 1);
  } else {
    s += link_s(m, 1, b);
    c.link_bytes.assign(static_cast<std::size_t>(std::max(1, m.hosts)), 0);
    c.link_bytes[static_cast<std::size_t>(hs)] = bytes;
  }
  c.ns = ns_of(s);
  return c;
}

}  // namespace dopt::detail::sim
