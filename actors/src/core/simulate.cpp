#include "dopt/actors/simulate.hpp"
#include "dopt/runtime/settings.hpp"
#include "collectives/access.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/ranks.hpp"
#include "transport/shm/shm_plane.hpp"
#include "sim/scheduler.hpp"

namespace dopt {
namespace {

// Rethrows e with `rank` attached, keeping the dopt::Error subclass.
[[noreturn]] void rethrow_with_rank(const std::exception_ptr& e, int rank) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (err.rank()) throw;
#define DOPT_RETHROW_AS(T)                                    \
  if (dynamic_cast<const T*>(&err)) throw T(err.op(), err.detail(), rank);
    DOPT_RETHROW_AS(PeerLostError)
    DOPT_RETHROW_AS(CollectiveMismatchError)
    DOPT_RETHROW_AS(TimeoutError)
    DOPT_RETHROW_AS(NotSupportedError)
    DOPT_RETHROW_AS(IOError)
    DOPT_RETHROW_AS(StateDictError)
    DOPT_RETHROW_AS(StateError)
    DOPT_RETHROW_AS(DeviceError)
    DOPT_RETHROW_AS(DTypeError)
    DOPT_RETHROW_AS(ShapeError)
    DOPT_RETHROW_AS(KeyError)
    DOPT_RETHROW_AS(TypeError)
    DOPT_RETHROW_AS(ValueError)
#undef DOPT_RETHROW_AS
    throw Error(err.op(), err.detail(), rank);
  } catch (const std::exception& ex) {
    throw Error("simulate", std::string("rank function raised: ") + ex.what(), rank);
  } catch (...) {
    throw Error("simulate", "rank function raised a non-standard exception", rank);
  }
}

}  // namespace

void simulate(int world_size, const std::function<void(RankContext&)>& fn, const SimulateOptions& options) {
  if (world_size < 1)
    throw ValueError("simulate", "world_size must be >= 1, got " + std::to_string(world_size));
  if (!fn) throw ValueError("simulate", "fn is empty");
  std::optional<Runtime> own;
  Runtime* rt = options.runtime;
  if (!rt) rt = &own.emplace(options.runtime_options);
  auto timeout = options.timeout.value_or(rt->options().collective_timeout);
  if (timeout.count() <= 0)
    throw ValueError("simulate", "timeout must be positive, got " + std::to_string(timeout.count()) + " ms");

  std::string plane = options.plane;
  plane = settings::text("DOPT_PLANE").value_or(plane);
  if (plane != "shm" && plane != "actor")
    throw ValueError("simulate", "plane must be 'shm' or 'actor', got '" + plane + "'");
  // Deterministic mode: asked for, or replayed from DOPT_SIM_SEED (which
  // leaves runs on the actor plane as they are).
  const auto env_seed = sim::env_seed();
  const bool deterministic = options.deterministic || (env_seed && plane == "shm");
  const std::uint64_t seed = env_seed ? *env_seed : options.seed;
  if (deterministic && plane != "shm")
    throw ValueError("simulate", "deterministic simulation runs on the shared-memory plane only, not on plane '" +
                                     plane + "'");
  if (!deterministic && !options.faults.empty())
    throw ValueError("simulate", "fault plans need deterministic = true");

  auto world = detail::spawn_local_world(dopt::detail::Access::impl(*rt), world_size);
  auto& endpoints = world.endpoints;
  auto members = std::make_shared<std::vector<int>>();
  for (int r = 0; r < world_size; ++r) members->push_back(r);
  std::shared_ptr<const std::vector<int>> cmembers = members;

  // The shared-memory plane: one per rank, over one directory of regions.
  std::vector<std::shared_ptr<detail::shm_plane::ShmPlane>> planes;
  std::vector<std::shared_ptr<detail::GroupPlane>> world_planes(static_cast<std::size_t>(world_size));
  if (plane == "shm") {
    auto dir = std::make_shared<detail::shm_plane::LocalDirectory>();
    const auto opts = detail::shm_plane::ShmPlane::Options::from_env(world_size, false);
    std::vector<detail::shm_plane::Mapped> regions;
    for (int r = 0; r < world_size; ++r) {
      planes.push_back(std::make_shared<detail::shm_plane::ShmPlane>(r, dir, world.table, opts));
      regions.push_back(planes.back()->create_region(0, world_size));
    }
    for (int r = 0; r < world_size; ++r)
      world_planes[static_cast<std::size_t>(r)] = planes[static_cast<std::size_t>(r)]->attach(0, cmembers, regions[static_cast<std::size_t>(r)]);
    for (int r = 0; r < world_size; ++r) dir->seal(0, r);
    for (auto& p : planes) {  // groups kept beyond simulate fail with StateError once the runtime stops
      std::weak_ptr<detail::shm_plane::ShmPlane> weak = p;
      detail::runtime_add_stopper(dopt::detail::Access::impl(*rt), [weak] {
        if (auto q = weak.lock()) q->shutdown("the runtime shut down");
      });
    }
  }
  planes.clear();  // the groups keep their plane
  // When simulate ends every rank is gone: calls on groups kept beyond it,
  // and calls still queued, end with PeerLostError instead of waiting.
  struct EndRanks {
    detail::PeerTable& table;
    ~EndRanks() {
      for (int r = 0; r < table.world_size(); ++r)
        table.mark(r, detail::PeerTable::lost, "rank " + std::to_string(r) + " ended with simulate");
    }
  } end_ranks{*world.table};

  std::mutex mutex;
  std::optional<std::pair<int, std::exception_ptr>> first;
  auto body = [&](int r) {
    auto g = std::make_shared<detail::GroupImpl>();
    g->endpoint = endpoints[static_cast<std::size_t>(r)];
    g->gid = 0;
    g->members = cmembers;
    g->my_grank = r;
    g->is_world = true;
    g->timeout_ms.store(timeout.count());
    g->plane = world_planes[static_cast<std::size_t>(r)];
    g->peers = world.table;
    try {
      RankContext ctx(r, world_size, detail::Access::group(std::move(g)));
      fn(ctx);
    } catch (const detail::sim::RankCrashed&) {
      // A fault plan crashed this rank: its peers see it lost (the scheduler marked it).
    } catch (const detail::sim::RankStopped&) {
      // A fault plan stopped this rank; the simulation is over.
    } catch (...) {
      auto e = std::current_exception();
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) first.emplace(r, e);
      }
      // After recording: the root cause is recorded before the PeerLostErrors it causes.
      endpoints[static_cast<std::size_t>(r)]->report_failure("rank " + std::to_string(r) + " raised: " + detail::sim::describe(e));
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  if (deterministic) {
    detail::sim::run_ranks(world_size, seed, options.faults, options.keep_trace, options.report, world.table, body);
  } else try {
    for (int r = 0; r < world_size; ++r) threads.emplace_back(body, r);
  } catch (...) {
    // Could not start every thread: fail the started ones' peers, then join.
    for (int r = static_cast<int>(threads.size()); r < world_size; ++r)
      endpoints[static_cast<std::size_t>(r)]->report_failure("rank thread could not be started");
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  endpoints.clear();  // each endpoint stops its rank actor
  if (own) own->shutdown();
  if (first) {
    if (deterministic)
      std::fprintf(stderr, "dopt simulate: seed %llu failed: rank %d: %s; replay with DOPT_SIM_SEED=%llu\n",
                   static_cast<unsigned long long>(seed), first->first, detail::sim::describe(first->second).c_str(),
                   static_cast<unsigned long long>(seed));
    rethrow_with_rank(first->second, first->first);
  }
}

namespace detail::sim {

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

}  // namespace

void run_ranks(int world_size, std::uint64_t seed, const FaultPlan& faults, bool keep_trace, SimReport* report,
               const std::shared_ptr<PeerTable>& table, const std::function<void(int)>& body,
               std::function<void(int)> on_crash) {
  // dopt-swarm's faults and trace dump (DOPT_SIM_FAULTS, DOPT_SIM_TRACE_DUMP).
  FaultPlan plan = faults;
  if (const auto extra = dopt::sim::env_faults())
    plan.faults.insert(plan.faults.end(), extra->faults.begin(), extra->faults.end());
  const auto dump = settings::text("DOPT_SIM_TRACE_DUMP");
  auto sched = std::make_shared<Scheduler>(seed, plan, world_size, table, keep_trace || dump);
  if (on_crash) sched->set_on_crash(std::move(on_crash));
  std::vector<Task*> tasks;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) tasks.push_back(sched->add(r, true, "main"));
  for (int r = 0; r < world_size; ++r)
    threads.emplace_back([&body, sched, t = tasks[static_cast<std::size_t>(r)], r] {
      sched->enter(t);
      body(r);
      sched->exit(t);
    });
  sched->start();
  sched->wait_over();
  const std::string deadlock = sched->deadlock();
  if (!deadlock.empty()) {
    // The threads that wait stay parked for good; they keep the scheduler alive.
    for (auto& t : threads) t.detach();
    threads.clear();
    if (report) sched->fill(*report);
    if (dump) append_trace(*dump, *sched, seed, world_size);
    std::fprintf(stderr, "dopt simulate: seed %llu: %s; replay with DOPT_SIM_SEED=%llu\n",
                 static_cast<unsigned long long>(seed), deadlock.c_str(), static_cast<unsigned long long>(seed));
    throw StateError("simulate", "seed " + std::to_string(seed) + ": " + deadlock);
  }
  if (sched->any_frozen() && table) {
    // The frozen threads (a stopped rank, a crashed rank's helpers) go on as
    // ordinary threads now: whatever they wait for ends at once.
    for (int r = 0; r < world_size; ++r)
      table->mark(r, PeerTable::lost, "rank " + std::to_string(r) + " ended with simulate");
  }
  for (auto& t : threads) t.join();
  threads.clear();
  if (report) sched->fill(*report);
  // For comparing whole test runs of a seed (the CTest swarm): one line per simulation.
  if (const auto log = settings::text("DOPT_SIM_TRACE_LOG")) {
    SimReport r;
    sched->fill(r);
    if (std::FILE* f = std::fopen(log->c_str(), "a")) {
      std::fprintf(f, "seed %llu world %d points %llu virtual_ns %lld trace %016llx %s\n",
                   static_cast<unsigned long long>(seed), world_size, static_cast<unsigned long long>(r.decisions),
                   static_cast<long long>(r.virtual_time.count()), static_cast<unsigned long long>(r.trace_hash),
                   dopt::sim::describe(r.fired).c_str());
      std::fclose(f);
    }
  }
  if (dump) append_trace(*dump, *sched, seed, world_size);
}

}  // namespace detail::sim

}  // namespace dopt
