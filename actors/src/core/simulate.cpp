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

#include "collectives/grow.hpp"
#include "core/ranks.hpp"
#include "transport/shm/shm_plane.hpp"
#include "sim/network.hpp"
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
  if (!deterministic && options.network)
    throw ValueError("simulate", "a network model needs deterministic = true");
  if (!deterministic && !options.faults.empty())
    throw ValueError("simulate", "fault plans need deterministic = true");
  if (!deterministic && ::dopt::sim::env_faults())
    throw ValueError("simulate", "DOPT_SIM_FAULTS is set but this run is not deterministic: set DOPT_SIM_SEED too "
                                 "(a run on plane 'actor' is never deterministic)");
  if (options.newcomers < 0 || (options.newcomers > 0 && !deterministic))
    throw ValueError("simulate", "newcomers need deterministic = true and must be >= 0, got " +
                                     std::to_string(options.newcomers));
  // Newcomers (ProcessGroup::grow): ranks world_size.. of the run, outside the world group.
  const int ranks = world_size + options.newcomers;
  if (options.network) detail::sim::check_network(*options.network, ranks);

  auto world = detail::spawn_local_world(dopt::detail::Access::impl(*rt), ranks);
  auto& endpoints = world.endpoints;
  auto members = std::make_shared<std::vector<int>>();
  for (int r = 0; r < world_size; ++r) members->push_back(r);
  std::shared_ptr<const std::vector<int>> cmembers = members;

  // The shared-memory plane: one per rank, over one directory of regions.
  std::vector<std::shared_ptr<detail::shm_plane::ShmPlane>> planes;
  std::vector<std::shared_ptr<detail::GroupPlane>> world_planes(static_cast<std::size_t>(ranks));
  if (plane == "shm") {
    auto dir = std::make_shared<detail::shm_plane::LocalDirectory>();
    const auto opts = detail::shm_plane::ShmPlane::Options::from_env(ranks, false);
    std::vector<detail::shm_plane::Mapped> regions;
    for (int r = 0; r < ranks; ++r) {
      planes.push_back(std::make_shared<detail::shm_plane::ShmPlane>(r, dir, world.table, opts));
      if (r < world_size) regions.push_back(planes.back()->create_region(0, world_size));
    }
    for (int r = world_size; r < ranks; ++r) {  // a newcomer's plane: a group of its own until it joins
      const auto gid = detail::newcomer_gid(r);
      auto& p = planes[static_cast<std::size_t>(r)];
      world_planes[static_cast<std::size_t>(r)] =
          p->attach(gid, std::make_shared<const std::vector<int>>(1, r), p->create_region(gid, 1));
      dir->seal(gid, r);
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

  if (deterministic) detail::open_grow_lobby(world.table.get(), options.job_id, options.secret);
  struct CloseLobby {
    const detail::PeerTable* table;
    ~CloseLobby() { detail::close_grow_lobby(table); }
  } close_lobby{world.table.get()};

  std::mutex mutex;
  std::optional<std::pair<int, std::exception_ptr>> first;
  auto body = [&](int r) {
    const bool newcomer = r >= world_size;
    auto g = std::make_shared<detail::GroupImpl>();
    g->endpoint = endpoints[static_cast<std::size_t>(r)];
    g->gid = newcomer ? detail::newcomer_gid(r) : 0;
    g->members = cmembers;
    g->my_grank = newcomer ? -1 : r;
    g->is_world = !newcomer;
    g->timeout_ms.store(timeout.count());
    g->plane = world_planes[static_cast<std::size_t>(r)];
    g->peers = world.table;
    try {
      RankContext ctx(r, world_size, detail::Access::group(std::move(g)), newcomer);
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
    detail::sim::run_ranks(ranks, seed, options.faults, options.keep_trace, options.report, world.table, body, {},
                           options.network);
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

}  // namespace dopt
