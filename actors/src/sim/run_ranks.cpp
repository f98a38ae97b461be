// run_ranks (scheduler.hpp): the ranks of one deterministic simulation as
// tasks of a Scheduler driven by the calling thread, and what the run leaves
// behind (report, DOPT_SIM_TRACE_LOG, DOPT_SIM_TRACE_DUMP).
#include <cstdio>
#include <string>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/settings.hpp"
#include "sim/scheduler.hpp"

namespace dopt::detail::sim {

namespace {

/// DOPT_SIM_TRACE_DUMP: the whole trace of one simulation, for dopt-swarm's diff.
void append_trace(const std::string& path, const Scheduler& sched, std::uint64_t seed, int world_size) {
  SimReport r;
  sched.fill(r);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return;
  std::fprintf(f, "simulate: seed %llu, %d ranks, %s\n", static_cast<unsigned long long>(seed), world_size,
               dopt::sim::describe(r.fired).c_str());
  for (const auto& line : r.faults) std::fprintf(f, "fault: %s\n", line.c_str());
  for (const auto& line : r.trace) std::fprintf(f, "%s\n", line.c_str());
  std::fclose(f);
}

/// DOPT_SIM_TRACE_LOG: one line per simulation, for comparing whole test runs of a seed (the CTest swarm).
void append_line(const std::string& path, const Scheduler& sched, std::uint64_t seed, int world_size) {
  SimReport r;
  sched.fill(r);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return;
  std::fprintf(f, "seed %llu world %d points %llu virtual_ns %lld trace %016llx %s\n",
               static_cast<unsigned long long>(seed), world_size, static_cast<unsigned long long>(r.decisions),
               static_cast<long long>(r.virtual_time.count()), static_cast<unsigned long long>(r.trace_hash),
               dopt::sim::describe(r.fired).c_str());
  std::fclose(f);
}

}  // namespace

void run_ranks(int world_size, std::uint64_t seed, const FaultPlan& faults, bool keep_trace, SimReport* report,
               const std::shared_ptr<PeerTable>& table, const std::function<void(int)>& body,
               std::function<void(int)> on_crash, const std::optional<dopt::sim::NetworkModel>& network) {
  // dopt-swarm's faults and trace dump (DOPT_SIM_FAULTS, DOPT_SIM_TRACE_DUMP).
  FaultPlan plan = faults;
  if (const auto extra = dopt::sim::env_faults())
    plan.faults.insert(plan.faults.end(), extra->faults.begin(), extra->faults.end());
  const auto dump = settings::text("DOPT_SIM_TRACE_DUMP");
  auto sched = std::make_shared<Scheduler>(seed, plan, world_size, table, keep_trace || dump);
  if (on_crash) sched->set_on_crash(std::move(on_crash));
  if (network) sched->set_network(*network);
  for (int r = 0; r < world_size; ++r) sched->add(r, true, "main", [&body, r] { body(r); });
  sched->run();
  const std::string deadlock = sched->deadlock();
  if (deadlock.empty() && sched->any_frozen() && table) {
    // The frozen tasks (a stopped rank, a crashed rank's helpers) run on in
    // finish(): whatever they wait for ends at once.
    for (int r = 0; r < world_size; ++r)
      table->mark(r, PeerTable::lost, "rank " + std::to_string(r) + " ended with simulate");
  }
  sched->finish();  // after a deadlock: the helpers only, the ranks' tasks are abandoned
  if (report) sched->fill(*report);
  if (dump) append_trace(*dump, *sched, seed, world_size);
  if (!deadlock.empty()) {
    std::fprintf(stderr, "dopt simulate: seed %llu: %s; replay with DOPT_SIM_SEED=%llu\n",
                 static_cast<unsigned long long>(seed), deadlock.c_str(), static_cast<unsigned long long>(seed));
    throw StateError("simulate", "seed " + std::to_string(seed) + ": " + deadlock);
  }
  if (const auto log = settings::text("DOPT_SIM_TRACE_LOG")) append_line(*log, *sched, seed, world_size);
}

}  // namespace dopt::detail::sim
