// The network model of deterministic simulation (SimulateOptions::network):
// the virtual time of a call is the model's formula (docs/testing.md, "A
// network model"), runs of a seed repeat, bytes per link are counted.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "dopt/actors/sim.hpp"
#include "dopt/actors/simulate.hpp"
#include "sim/sim_test_options.hpp"

using namespace dopt;
using std::chrono::nanoseconds;

namespace {

sim::NetworkModel model(int hosts, int per_host) {
  sim::NetworkModel m;
  m.hosts = hosts;
  m.ranks_per_host = per_host;
  m.link_latency = std::chrono::microseconds(50);
  m.link_bandwidth = 1e9;
  m.host_memory_bandwidth = 1e10;
  m.cores_per_host = 2;
  m.call_overhead = std::chrono::microseconds(3);
  m.sync_latency = std::chrono::microseconds(7);
  return m;
}

/// One all_reduce of `floats` float32 elements on `world` ranks under m.
SimReport all_reduce_run(int world, std::int64_t floats, const sim::NetworkModel& m, std::uint64_t seed = 1,
                         bool keep_trace = false) {
  SimReport rep;
  auto o = sim_test::deterministic(seed, &rep, std::chrono::seconds(30));
  o.network = m;
  o.keep_trace = keep_trace;
  simulate(world, [&](RankContext& ctx) {
    Tensor t = Tensor::full({floats}, 1.0 + ctx.rank());
    ctx.world().all_reduce(t);
  }, o);
  return rep;
}

nanoseconds ns(double seconds) { return nanoseconds(static_cast<std::int64_t>(std::llround(seconds * 1e9))); }

}  // namespace

TEST_CASE("network model: an all_reduce on one host takes the shared-memory plane's time", "[sim][netmodel]") {
  const auto m = model(1, 0);
  // 3 ranks, 1 MiB: staged, one chunk (two synchronisations); each member
  // moves B (5n - 2) / n bytes, 3 members on 2 cores.
  const double b = 1 << 20;
  const auto staged = ns(3e-6 + 2 * 7e-6 + b * 13 / 3 * 3 / 1e10);
  const SimReport big = all_reduce_run(3, 1 << 18, m);
  CHECK(big.modelled_time == staged);
  CHECK(big.virtual_time == staged);
  CHECK(big.link_bytes == std::vector<std::uint64_t>{0});
  // 5 ranks, 4 KiB: one small round; each member moves (n + 3) B bytes, 5 members on 2 cores.
  const auto small = ns(3e-6 + 7e-6 + 4096.0 * 8 * 5 / 1e10);
  const SimReport tiny = all_reduce_run(5, 1024, m);
  CHECK(tiny.modelled_time == small);
  CHECK(tiny.virtual_time == small);
}

TEST_CASE("network model: data that fits the cache moves at the cache's bandwidth", "[sim][netmodel]") {
  auto m = model(1, 0);
  m.host_cache_bandwidth = 4e10;
  m.host_cache_bytes = 6u << 20;
  // 2 ranks, 1 MiB, one chunk: what the members touch between two uses of a byte (their 1 MiB and two
  // chunks of buffer each, as rounds alternate between two buffers) is 6 MiB: all of it (4 B a member)
  // moves at the cache's bandwidth
  const double b = 1 << 20;
  CHECK(all_reduce_run(2, 1 << 18, m).modelled_time == ns(3e-6 + 2 * 7e-6 + b * 4 / 4e10 * 2));
  // with a byte less of cache, all of it from memory
  m.host_cache_bytes = (6u << 20) - 1;
  CHECK(all_reduce_run(2, 1 << 18, m).modelled_time == ns(3e-6 + 2 * 7e-6 + b * 4 / 1e10 * 2));
  // 3 ranks: 9 MiB, past 8 MiB of cache: all from memory
  m.host_cache_bytes = 8u << 20;
  CHECK(all_reduce_run(3, 1 << 18, m).modelled_time == ns(3e-6 + 2 * 7e-6 + (2 * b + b * 7 / 3) / 1e10 * 3));
  // 256 KiB chunks, 2 ranks: 2 x (1 MiB + 2 chunks) = 3 MiB; 4 chunks (8 synchronisations). From memory
  // with 2 MiB of cache, from the cache with 3 MiB
  m.shm_buffer_bytes = 256u << 10;
  m.host_cache_bytes = 2u << 20;
  CHECK(all_reduce_run(2, 1 << 18, m).modelled_time == ns(3e-6 + 8 * 7e-6 + b * 4 / 1e10 * 2));
  m.host_cache_bytes = 3u << 20;
  CHECK(all_reduce_run(2, 1 << 18, m).modelled_time == ns(3e-6 + 8 * 7e-6 + b * 4 / 4e10 * 2));
}

TEST_CASE("network model: a phase longer than the waiters' spin costs a wake-up per wave of members",
          "[sim][netmodel]") {
  auto m = model(1, 0);
  m.wake_latency = std::chrono::microseconds(30);
  const double b = 1 << 20;
  // 2 ranks on 2 cores, 1 MiB: each does the same work at once (half of 4 MiB at 1e10 / 2 cores per phase),
  // so they arrive together: no wake-up however long the phase
  CHECK(all_reduce_run(2, 1 << 18, m).modelled_time == ns(3e-6 + 2 * 7e-6 + 4 * b / 1e10 * 2));
  // 4 KiB: one round whose staging (8 KiB at 5e9 a core: 1.6 us) is within the spin: no wake-up
  CHECK(all_reduce_run(2, 1024, m).modelled_time == ns(3e-6 + 7e-6 + 4096.0 * 5 / 1e10 * 2));
  // 5 ranks on 2 cores poll 2 us: the 4 KiB round's 1.6 us stays within it; at 1 MiB each synchronisation
  // waits for 3 waves of members
  CHECK(all_reduce_run(5, 1024, m).modelled_time == ns(3e-6 + 7e-6 + 4096.0 * 8 * 5 / 1e10));
  CHECK(all_reduce_run(5, 1 << 18, m).modelled_time ==
        ns(3e-6 + 2 * (7e-6 + 3 * 30e-6) + (2 * b + b * 13 / 5) / 1e10 * 5));
  // 4 ranks on 2 cores: the two members of each core hand it to each other (a waiter yields before it sleeps)
  // and those of both cores arrive together: no wake-up
  CHECK(all_reduce_run(4, 1 << 18, m).modelled_time == ns(3e-6 + 2 * 7e-6 + (2 * b + b * 10 / 4) / 1e10 * 4));
  // without a wake-up latency nothing changes
  m.wake_latency = nanoseconds(0);
  CHECK(all_reduce_run(5, 1 << 18, m).modelled_time == ns(3e-6 + 2 * 7e-6 + (2 * b + b * 13 / 5) / 1e10 * 5));
}

TEST_CASE("network model: reads of what members on other cores just wrote go at the exchange rate",
          "[sim][netmodel]") {
  auto m = model(1, 0);
  m.exchange_bandwidth = 2e9;
  const double b = 1 << 20;
  // 2 ranks, 4 KiB: one round; each member reads the other's 4 KiB staging at 2e9 past the memory's time
  CHECK(all_reduce_run(2, 1024, m).modelled_time == ns(3e-6 + 7e-6 + 4096.0 * 5 / 1e10 * 2 + 4096.0 / 2e9));
  // 5 ranks on 2 cores: of the 4 others, 2 wrote on the reader's core (3 share it) and 2 on the other;
  // the members take turns (5 on 2 cores)
  CHECK(all_reduce_run(5, 1024, m).modelled_time ==
        ns(3e-6 + 7e-6 + 4096.0 * 8 * 5 / 1e10 + 4 * 4096.0 * 2 / 4 / 2e9 * 5 / 2));
  // the staged path's slices are charged only while they fit a quarter of a core's own cache (unknown: never)
  CHECK(all_reduce_run(2, 1 << 18, m).modelled_time == ns(3e-6 + 2 * 7e-6 + 4 * b / 1e10 * 2));
  m.core_cache_bytes = 1u << 20;  // slices of 256 KiB and less
  // 2 ranks, 1 MiB: slices of 512 KiB have left the writer's cache
  CHECK(all_reduce_run(2, 1 << 18, m).modelled_time == ns(3e-6 + 2 * 7e-6 + 4 * b / 1e10 * 2));
  // 4 ranks on 2 cores, 1 MiB: slices of 256 KiB; each reads 3 / 2 MiB of the others', 2 of the 3 on the
  // other core; 4 members take turns on 2 cores
  CHECK(all_reduce_run(4, 1 << 18, m).modelled_time ==
        ns(3e-6 + 2 * 7e-6 + (2 * b + b * 10 / 4) / 1e10 * 4 + 1.5 * b * 2 / 3 / 2e9 * 4 / 2));
  // 2 ranks, 256 KiB: slices of 128 KiB; each reads the other's 256 KiB
  const double q = 1 << 18;
  CHECK(all_reduce_run(2, 1 << 16, m).modelled_time == ns(3e-6 + 2 * 7e-6 + 4 * q / 1e10 * 2 + q / 2e9));
  // a send within a host: the receiver reads the sender's copy (4000 B) at 2e9
  SimReport rep;
  auto o = sim_test::deterministic(3, &rep, std::chrono::seconds(30));
  o.network = m;
  simulate(2, [&](RankContext& ctx) {
    Tensor t = Tensor::full({1000}, 1.0);
    if (ctx.rank() == 0)
      ctx.world().send(t, 1, 0);
    else
      ctx.world().recv(t, 0, 0);
  }, o);
  CHECK(rep.modelled_time == ns(3e-6 + 7e-6 + 8000.0 * 2 / 1e10 + 4000 / 2e9));
  // a negative rate is refused
  m.exchange_bandwidth = -1;
  auto refused = sim_test::deterministic(1, nullptr, std::chrono::seconds(30));
  refused.network = m;
  CHECK_THROWS_AS(simulate(2, [](RankContext&) {}, refused), ValueError);
}

TEST_CASE("network model: an all_reduce across hosts adds the hierarchical plane's link time", "[sim][netmodel]") {
  // 5 ranks on 2 hosts (3 + 2), 4 KiB: the small round among 3 members,
  // then a chain through the hosts and the result back: 2 latencies, B each way on the link.
  const double b = 4096;
  const SimReport rep = all_reduce_run(5, 1024, model(2, 3));
  CHECK(rep.modelled_time == ns(3e-6 + 7e-6 + b * 6 * 3 / 1e10 + 2 * 50e-6 + b / 1e9));
  CHECK(rep.link_bytes == std::vector<std::uint64_t>{4096, 4096});
  // one rank per host, at most 64 KiB: the TCP ring's latency path, every host sends B to every other at once
  const SimReport small = all_reduce_run(3, 3 << 10, model(3, 1));
  const double sb = 3 << 12;
  CHECK(small.modelled_time == ns(3e-6 + 50e-6 + 2 * sb / 1e9));
  CHECK(small.link_bytes == std::vector<std::uint64_t>{24576, 24576, 24576});
  // larger: the ring, 2 (H - 1) steps, each host sends 2 (H - 1) / H of B
  const SimReport ring = all_reduce_run(3, 3 << 15, model(3, 1));
  const double rb = 3 << 17;
  CHECK(ring.modelled_time == ns(3e-6 + 4 * 50e-6 + 4.0 / 3 * rb / 1e9));
  CHECK(ring.link_bytes == std::vector<std::uint64_t>{524288, 524288, 524288});
  // two hosts take the latency path up to 2 MiB (B each way, one latency), the ring past it
  const SimReport pair = all_reduce_run(2, 1 << 19, model(2, 1));
  CHECK(pair.modelled_time == ns(3e-6 + 50e-6 + 2.0 * (1 << 20) / 1e9));
  CHECK(pair.link_bytes == std::vector<std::uint64_t>{2u << 20, 2u << 20});
  const SimReport piped = all_reduce_run(2, 1 << 20, model(2, 1));
  CHECK(piped.modelled_time == ns(3e-6 + 2 * 50e-6 + 4.0 * (1 << 20) / 1e9));
  CHECK(piped.link_bytes == std::vector<std::uint64_t>{4u << 20, 4u << 20});
}

TEST_CASE("network model: on a shaped link the latencies and the bytes overlap", "[sim][netmodel]") {
  auto m = model(2, 1);
  m.link_shaped = true;
  // 16 KiB: the latency (50 us) is longer than 16 KiB at 1e9 (16.4 us): the latency counts
  CHECK(all_reduce_run(2, 1 << 12, m).modelled_time == ns(3e-6 + 50e-6));
  // 2 MiB: the bytes (2.1 ms) count
  CHECK(all_reduce_run(2, 1 << 19, m).modelled_time == ns(3e-6 + 2.0 * (1 << 20) / 1e9));
  // the ring past 2 MiB: two latencies against 4 MiB
  CHECK(all_reduce_run(2, 1 << 20, m).modelled_time == ns(3e-6 + 4.0 * (1 << 20) / 1e9));
  // the bytes each link carries do not change
  CHECK(all_reduce_run(2, 1 << 19, m).link_bytes == std::vector<std::uint64_t>{2u << 20, 2u << 20});
}

TEST_CASE("network model: two hosts take longer than one at a large size", "[sim][netmodel]") {
  const std::int64_t floats = 4 << 20;  // 16 MiB
  const SimReport one = all_reduce_run(4, floats, model(1, 4));
  const SimReport two = all_reduce_run(4, floats, model(2, 2));
  CHECK(two.virtual_time > one.virtual_time);
  CHECK(two.link_bytes == std::vector<std::uint64_t>{16u << 20, 16u << 20});
}

TEST_CASE("network model: two runs of a seed give the same trace", "[sim][netmodel]") {
  for (std::uint64_t seed : {1u, 7u}) {
    const SimReport a = all_reduce_run(5, 1 << 12, model(2, 3), seed, true);
    const SimReport b = all_reduce_run(5, 1 << 12, model(2, 3), seed, true);
    CHECK(sim::compare_traces(a, b).empty());
    CHECK(a.trace_hash == b.trace_hash);
    CHECK(a.virtual_time == b.virtual_time);
  }
}

TEST_CASE("network model: sends across hosts are counted on the sender's link", "[sim][netmodel]") {
  SimReport rep;
  auto o = sim_test::deterministic(3, &rep, std::chrono::seconds(30));
  o.network = model(2, 2);
  simulate(3, [&](RankContext& ctx) {
    Tensor t = Tensor::full({1000}, 1.0);
    if (ctx.rank() == 0) {
      ctx.world().send(t, 2, 0);  // host 0 -> host 1
      ctx.world().send(t, 1, 0);  // within host 0
    } else if (ctx.rank() == 1) {
      ctx.world().recv(t, 0, 0);
    } else {
      ctx.world().recv(t, 0, 0);
    }
  }, o);
  CHECK(rep.link_bytes == std::vector<std::uint64_t>{4000, 0});
  // the cross-host send: overhead, latency, 4000 B on the link; the local one: a round and a copy
  CHECK(rep.modelled_time == ns(3e-6 + 50e-6 + 4000 / 1e9) + ns(3e-6 + 7e-6 + 8000.0 * 2 / 1e10));
}

TEST_CASE("network model: costs of zero leave the trace as it was", "[sim][netmodel]") {
  sim::NetworkModel free;
  free.hosts = 2;
  free.link_latency = nanoseconds(0);
  free.link_bandwidth = 1e30;
  free.host_memory_bandwidth = 1e30;
  free.sync_latency = nanoseconds(0);
  const SimReport with = all_reduce_run(3, 64, free, 5, true);
  SimReport without;
  auto o = sim_test::deterministic(5, &without, std::chrono::seconds(30));
  o.keep_trace = true;
  simulate(3, [&](RankContext& ctx) {
    Tensor t = Tensor::full({64}, 1.0 + ctx.rank());
    ctx.world().all_reduce(t);
  }, o);
  CHECK(with.trace_hash == without.trace_hash);
  CHECK(with.virtual_time == nanoseconds(0));
}

TEST_CASE("network model: asked for without deterministic, or not fitting the world, is a ValueError",
          "[sim][netmodel]") {
  SimulateOptions o;
  o.network = model(1, 0);
  auto noop = [](RankContext&) {};
  CHECK_THROWS_AS(simulate(2, noop, o), ValueError);
  o.deterministic = true;
  o.network = model(2, 1);
  CHECK_THROWS_AS(simulate(3, noop, o), ValueError);
}
