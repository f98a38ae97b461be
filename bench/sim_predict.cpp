// dopt_bench_sim predict: the network model's prediction of one collective's
// time (SimulateOptions::network, docs/testing.md "A network model").
//
//   dopt_bench_sim predict --hosts 2 --per-host 1 --bytes 4096 1048576 67108864
//     --link-gbits 0.95 --link-latency-us 60 [--link-shaped: tc tbf's links] --memory-gbs 12
//     --cache-gbs 60 --cache-bytes 33554432 --cores 2 --sync-us 8 --wake-us 25 --exchange-gbs 5
//     --core-cache-bytes 1048576 [--op all_reduce|broadcast|all_gather]
//     [--shm-small-bytes, --shm-buffer-bytes, --tcp-small-bytes, --tcp-pair-bytes: the planes' limits,
//      their defaults those of the planes]
//
// For each size: one deterministic simulate() of hosts x per-host ranks
// running one collective (float32; all_reduce: a sum of that many bytes;
// all_gather: that many bytes of output); prints one JSON
// line per size: {"benchmark": "sim_predict", "op", "bytes", "hosts",
// "per_host", "predicted_us", "link_bytes": [per host], and the model}.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/simulate.hpp"

int sim_predict_main(int argc, char** argv) {
  CLI::App app{"dopt_bench_sim predict: the network model's time of a collective"};
  dopt::sim::NetworkModel m;
  int per_host = 1;
  std::vector<long long> sizes{4096, 1 << 20, 64 << 20};
  std::string op = "all_reduce";
  double link_gbits = 10, latency_us = 20, memory_gbs = 20, sync_us = 5, overhead_us = 0;
  app.add_option("--hosts", m.hosts, "hosts")->check(CLI::PositiveNumber);
  app.add_option("--per-host", per_host, "ranks per host")->check(CLI::PositiveNumber);
  app.add_option("--bytes", sizes, "sizes (bytes of the tensor)");
  app.add_option("--op", op, "all_reduce, broadcast or all_gather (bytes: the output)");
  app.add_option("--link-gbits", link_gbits, "link payload rate, Gbit/s each way");
  app.add_option("--link-latency-us", latency_us, "one message between hosts, us");
  app.add_flag("--link-shaped", m.link_shaped, "the links are shaped by a token bucket (tc tbf), not wires");
  app.add_option("--memory-gbs", memory_gbs, "host memory traffic (read + written), GB/s, all cores");
  double cache_gbs = 0;
  app.add_option("--cache-gbs", cache_gbs, "host cache traffic, GB/s, all cores (0: no cache)");
  app.add_option("--cache-bytes", m.host_cache_bytes, "host cache size, bytes");
  app.add_option("--cores", m.cores_per_host, "cores per host")->check(CLI::PositiveNumber);
  app.add_option("--sync-us", sync_us, "one synchronisation of a host's members, us");
  app.add_option("--overhead-us", overhead_us, "every call, us");
  double wake_us = 0, spin_us = 20, spin_past_us = 2;
  app.add_option("--wake-us", wake_us, "a sleeping member's wake-up on another core, us (0: never sleeps)");
  app.add_option("--spin-us", spin_us, "how long waiters poll before they sleep, us");
  app.add_option("--spin-past-cores-us", spin_past_us, "the same when the members outnumber the cores, us");
  double exchange_gbs = 0;
  app.add_option("--exchange-gbs", exchange_gbs,
                 "reading what another core just wrote, GB/s a core (0: not modelled)");
  app.add_option("--core-cache-bytes", m.core_cache_bytes, "a core's own cache (0: unknown)");
  app.add_option("--shm-small-bytes", m.shm_small_bytes, "the shared-memory plane's one-round limit");
  app.add_option("--shm-buffer-bytes", m.shm_buffer_bytes, "the shared-memory plane's buffer");
  app.add_option("--tcp-small-bytes", m.tcp_small_bytes,
                 "the TCP ring's latency path: at most this many bytes go to every host at once");
  app.add_option("--tcp-pair-bytes", m.tcp_pair_bytes, "the same limit between two hosts");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  m.ranks_per_host = per_host;
  m.link_bandwidth = link_gbits * 1e9 / 8;
  m.host_memory_bandwidth = memory_gbs * 1e9;
  m.host_cache_bandwidth = cache_gbs * 1e9;
  m.exchange_bandwidth = exchange_gbs * 1e9;
  auto us = [](double x) { return std::chrono::nanoseconds(static_cast<long long>(x * 1e3)); };
  m.link_latency = us(latency_us);
  m.sync_latency = us(sync_us);
  m.call_overhead = us(overhead_us);
  m.wake_latency = us(wake_us);
  m.spin = us(spin_us);
  m.spin_past_cores = us(spin_past_us);
  const int world = m.hosts * per_host;
  try {
    for (long long bytes : sizes) {
      dopt::SimReport rep;
      dopt::SimulateOptions o;
      o.deterministic = true;
      o.seed = 1;
      o.report = &rep;
      o.network = m;
      const std::int64_t n = op == "all_gather" ? bytes / 4 / world : bytes / 4;
      dopt::simulate(world, [&](dopt::RankContext& ctx) {
        dopt::Tensor t = dopt::Tensor::full({n}, 1.0);
        if (op == "all_reduce") {
          ctx.world().all_reduce(t);
        } else if (op == "broadcast") {
          ctx.world().broadcast(t, 0);
        } else if (op == "all_gather") {
          std::vector<dopt::Tensor> out;
          for (int r = 0; r < ctx.world_size(); ++r) out.push_back(dopt::Tensor::zeros({n}));
          ctx.world().all_gather(out, t);
        } else {
          throw dopt::ValueError("dopt_bench_sim predict", "unknown --op '" + op + "'");
        }
      }, o);
      std::string links;
      for (std::size_t h = 0; h < rep.link_bytes.size(); ++h)
        links += (h ? ", " : "") + std::to_string(rep.link_bytes[h]);
      std::printf("{\"benchmark\": \"sim_predict\", \"op\": \"%s\", \"bytes\": %lld, \"hosts\": %d, \"per_host\": %d, "
                  "\"predicted_us\": %.2f, \"link_bytes\": [%s], \"link_gbits\": %g, \"link_shaped\": %s, \"link_latency_us\": %g, "
                  "\"memory_gbs\": %g, \"cache_gbs\": %g, \"cache_bytes\": %zu, \"cores\": %d, \"sync_us\": %g, \"overhead_us\": %g, "
                  "\"wake_us\": %g, \"spin_us\": %g, \"spin_past_cores_us\": %g, \"exchange_gbs\": %g, \"core_cache_bytes\": %zu}\n",
                  op.c_str(), bytes, m.hosts, per_host, rep.modelled_time.count() / 1e3, links.c_str(), link_gbits,
                  m.link_shaped ? "true" : "false", latency_us, memory_gbs, cache_gbs, m.host_cache_bytes, m.cores_per_host, sync_us, overhead_us, wake_us,
                  spin_us, spin_past_us, exchange_gbs, m.core_cache_bytes);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dopt_bench_sim predict: %s\n", e.what());
    return 1;
  }
  return 0;
}
