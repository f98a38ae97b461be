// The swarm runner, replay from DOPT_SIM_SEED and the determinism check.
#include <cstdio>
#include <cstring>
#include "dopt/runtime/settings.hpp"
#include <cstdlib>
#include <exception>

#include "dopt/actors/simulate.hpp"
#include "dopt/runtime/error.hpp"
#include "sim/scheduler.hpp"

namespace dopt::sim {

std::optional<std::uint64_t> env_seed() { return settings::unsigned_integer("DOPT_SIM_SEED"); }

std::string describe(const FaultCounts& c) {
  std::string out = std::to_string(c.total()) + (c.total() == 1 ? " fault" : " faults");
  const std::pair<std::uint64_t, const char*> kinds[] = {
      {c.collective_delays, "collective delay"}, {c.p2p_delays, "p2p delay"},   {c.rpc_delays, "rpc delay"},
      {c.collective_drops, "collective drop"},   {c.p2p_drops, "p2p drop"},     {c.rpc_drops, "rpc drop"},
      {c.partitioned, "partitioned message"},    {c.crashes, "crash"},          {c.stops, "stop"},
      {c.read_faults, "read fault"}};
  const char* sep = ": ";
  for (const auto& [n, what] : kinds) {
    if (n == 0) continue;
    out += sep + std::to_string(n) + " " + what + (n == 1 ? "" : (what[std::strlen(what) - 1] == 'h' ? "es" : "s"));
    sep = ", ";
  }
  return out;
}

std::string compare_traces(const SimReport& a, const SimReport& b) {
  if (a.trace_hash == b.trace_hash && a.decisions == b.decisions && a.faults == b.faults && a.fired == b.fired)
    return "";
  std::string out = "seed " + std::to_string(a.seed) + " is not deterministic: trace hashes " +
                    std::to_string(a.trace_hash) + " and " + std::to_string(b.trace_hash) + ", " +
                    std::to_string(a.decisions) + " and " + std::to_string(b.decisions) + " scheduling points";
  const std::size_t n = std::min(a.trace.size(), b.trace.size());
  for (std::size_t i = 0; i < n; ++i)
    if (a.trace[i] != b.trace[i])
      return out + "; first difference at point " + std::to_string(i) + ": '" + a.trace[i] + "' vs '" + b.trace[i] + "'";
  if (a.faults != b.faults || a.fired != b.fired)
    return out + "; the faults that fired differ (" + describe(a.fired) + " and " + describe(b.fired) + ")";
  return out;
}

SwarmResult swarm(const std::function<void(const SimulateOptions&)>& body, const SwarmOptions& options,
                  const SimulateOptions& base) {
  if (!body) throw ValueError("sim::swarm", "body is empty");
  if (options.seeds < 1) throw ValueError("sim::swarm", "seeds must be >= 1, got " + std::to_string(options.seeds));
  SwarmResult result;
  const auto replay = env_seed();
  const auto start = std::chrono::steady_clock::now();
  const int n = replay ? 1 : options.seeds;
  for (int i = 0; i < n; ++i) {
    if (i > 0 && std::chrono::steady_clock::now() - start >= options.budget) break;
    const std::uint64_t seed = replay ? *replay : options.first_seed + static_cast<std::uint64_t>(i);
    ++result.tried;
    auto run = [&](SimReport& rep, bool keep) -> std::exception_ptr {
      SimulateOptions o = base;
      o.deterministic = true;
      o.seed = seed;
      o.report = &rep;
      o.keep_trace = keep;
      try {
        body(o);
      } catch (...) {
        return std::current_exception();
      }
      return nullptr;
    };
    SimReport first;
    if (auto e = run(first, false)) {
      result.failing_seed = seed;
      result.failure = detail::sim::describe(e);
    } else if (options.check_determinism) {
      SimReport second;
      auto e2 = run(second, false);
      std::string diff = compare_traces(first, second);
      if (!diff.empty()) {
        // Again with the traces kept, to say where the runs part.
        SimReport a, b;
        run(a, true);
        run(b, true);
        if (const std::string d = compare_traces(a, b); !d.empty()) diff = d;
        result.nondeterministic = true;
      } else if (e2) {
        diff = "seed " + std::to_string(seed) + " passed once and failed when run again: " + detail::sim::describe(e2);
        result.nondeterministic = true;
      }
      if (!diff.empty()) {
        result.failing_seed = seed;
        result.failure = diff;
      }
    }
    if (result.failing_seed) {
      if (options.print)
        std::fprintf(stderr, "dopt sim::swarm: seed %llu failed (%d seed(s) tried): %s\n  replay with DOPT_SIM_SEED=%llu\n",
                     static_cast<unsigned long long>(seed), result.tried, result.failure.c_str(),
                     static_cast<unsigned long long>(seed));
      return result;
    }
  }
  return result;
}

SwarmResult swarm(const std::function<void(const SimulateOptions&)>& body, const SwarmOptions& options) {
  return swarm(body, options, SimulateOptions{});
}

}  // namespace dopt::sim
