// Starting workers: rpc::init (real processes, over the runtime's
// rendezvous), rpc::simulate (workers in this process) and rpc::run.
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <thread>

#include "caf/io/all.hpp"
#include "collectives/access.hpp"
#include "core/caf_thread.hpp"
#include "core/ranks.hpp"
#include "core/rendezvous_internal.hpp"
#include "rpc/core.hpp"
#include "sim/scheduler.hpp"
#include "core/world_setup.hpp"

namespace dopt::rpc {

namespace detail {
namespace {

void check_names(const std::vector<std::string>& names, int rank) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) throw ValueError("rpc.init", "rank " + std::to_string(i) + " has an empty name", rank);
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] == names[j])
        throw ValueError("rpc.init", "ranks " + std::to_string(j) + " and " + std::to_string(i) +
                                         " have the same name '" + names[i] + "' (names must be unique)", rank);
  }
}

/// rpc::simulate in deterministic mode: the workers' threads are the rank
/// tasks of one seeded scheduler, their agents SimAgents (no CAF, no runtime).
void simulate_deterministic(int n, const std::vector<std::string>& names, const std::function<void(Agent&)>& fn,
                            const SimulateOptions& options, std::uint64_t seed) {
  namespace sim = ::dopt::detail::sim;
  std::vector<std::shared_ptr<AgentCore>> cores;
  for (int r = 0; r < n; ++r) {
    cores.push_back(new_core(names[static_cast<std::size_t>(r)], r, n, options.rpc));
    cores.back()->names = names;
  }
  make_sim_agents(cores);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  auto body = [&](int r) {
    const auto& core = cores[static_cast<std::size_t>(r)];
    Agent agent(core);
    start_sim_agent(*core);
    for (int phase = 0; phase < 2; ++phase) {
      try {
        if (phase == 0)
          fn(agent);
        else
          agent.shutdown();
      } catch (const sim::RankCrashed&) {
        core->stop(true);  // a fault plan crashed the worker: its peers see it lost
        return;
      } catch (const sim::RankStopped&) {
        core->stop(true);  // a fault plan stopped it; the simulation is over
        return;
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        core->stop(true);  // as if its process died: its peers see it
        return;
      }
    }
  };
  struct StopAll {
    std::vector<std::shared_ptr<AgentCore>>& cores;
    ~StopAll() {
      for (auto& c : cores) c->stop(true);
    }
  } stop_all{cores};
  // A crash on any of a worker's threads (its own, or a pool thread's call)
  // kills its agent at once: its peers see it lost, in virtual time.
  sim::run_ranks(n, seed, options.faults, options.keep_trace, options.report, nullptr, body,
                 [&cores](int r) { cores[static_cast<std::size_t>(r)]->stop(true); });
  for (int r = 0; r < n; ++r)
    if (auto& e = errors[static_cast<std::size_t>(r)]) {
      std::fprintf(stderr, "dopt rpc::simulate: seed %llu failed: worker %d: %s; replay with DOPT_SIM_SEED=%llu\n",
                   static_cast<unsigned long long>(seed), r, dopt::detail::sim::describe(e).c_str(),
                   static_cast<unsigned long long>(seed));
      std::rethrow_exception(e);
    }
}

}  // namespace
}  // namespace detail

Agent init(Runtime& runtime, const LaunchEnv& launch_env, const std::string& name, const RpcOptions& options) {
  ::dopt::detail::UserThreadCafScope caf_scope;
  // env.secret becomes the session key in the rendezvous: the agents' ports
  // are keyed (rendezvous_internal.hpp).
  LaunchEnv env = launch_env;
  const int rank = env.rank, world_size = env.world_size;
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw ValueError("rpc.init", "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_size) + ")",
                     rank);
  if (name.empty()) throw ValueError("rpc.init", "the worker name is empty", rank);
  auto& sys = dopt::detail::runtime_system(dopt::detail::Access::impl(runtime), "rpc.init");
  auto core = detail::make_core(sys, name, rank, world_size, options);
  std::weak_ptr<AgentCore> weak = core;
  dopt::detail::runtime_add_stopper(dopt::detail::Access::impl(runtime), [weak] {
    if (auto c = weak.lock()) c->stop(false);
  });
  try {
    caf::actor a = core->handle();
    char hostname[256] = {};
    ::gethostname(hostname, sizeof hostname - 1);
    const std::string host = hostname;
    auto make_info = [&] {
      // The agent's port is behind dopt's handshake (job id, secret): only the
      // job's own workers reach its functions.
      return "host=" + host + dopt::detail::publish_control_port(dopt::detail::Access::impl(runtime), sys, a, env, "rpc.init") +
             " name=" + name;
    };
    RendezvousResult rdv =
        dopt::detail::rendezvous_with(runtime, launch_env, options.init_timeout, a, make_info, &env.secret);
    const auto& infos = dopt::detail::rendezvous_infos(rdv);
    auto field = [](const std::string& text, const std::string& key, bool rest) {
      auto p = text.find(key + "=");
      if (p == std::string::npos) return std::string();
      p += key.size() + 1;
      return rest ? text.substr(p) : text.substr(p, text.find(' ', p) - p);
    };
    core->names.clear();
    for (const auto& info : infos) core->names.push_back(field(info, "name", true));
    detail::check_names(core->names, rank);
    std::vector<caf::actor> peers = dopt::detail::rendezvous_payloads(rdv);
    peers[static_cast<std::size_t>(rank)] = a;
    // Direct connections (as init_process_group): rank i > 0 connects to
    // every rank above it, so that every death is seen by every worker.
    dopt::detail::setup_step(rdv, rank, "rpc.init", [&] {
      for (int r = std::max(1, rank + 1); rank > 0 && r < world_size; ++r)
        peers[static_cast<std::size_t>(r)] = dopt::detail::connect_control_port(
            sys, env, r, "host=" + host, infos[static_cast<std::size_t>(r)], "rpc.init");
    });
    detail::start_agent(sys, core, std::move(peers));
    rdv.barrier(options.init_timeout);
    core->keep = std::make_shared<RendezvousResult>(rdv);
  } catch (...) {
    core->stop(true);
    throw;
  }
  return Agent(core);
}

void simulate(int n, const std::function<void(Agent&)>& fn, const SimulateOptions& options) {
  if (n < 1) throw ValueError("rpc.simulate", "n must be >= 1, got " + std::to_string(n));
  if (!fn) throw ValueError("rpc.simulate", "fn is empty");
  std::vector<std::string> names = options.names;
  if (names.empty())
    for (int r = 0; r < n; ++r) names.push_back("worker" + std::to_string(r));
  if (static_cast<int>(names.size()) != n)
    throw ValueError("rpc.simulate", std::to_string(names.size()) + " names for " + std::to_string(n) + " workers");
  detail::check_names(names, 0);
  const auto env_seed = ::dopt::sim::env_seed();
  if (options.deterministic || env_seed)
    return detail::simulate_deterministic(n, names, fn, options, env_seed ? *env_seed : options.seed);
  if (!options.faults.empty()) throw ValueError("rpc.simulate", "fault plans need deterministic = true");
  if (::dopt::sim::env_faults())
    throw ValueError("rpc.simulate", "DOPT_SIM_FAULTS is set but this run is not deterministic: set DOPT_SIM_SEED too");
  std::optional<Runtime> own;
  Runtime* rt = options.runtime;
  if (!rt) rt = &own.emplace(options.runtime_options);
  auto& sys = dopt::detail::runtime_system(dopt::detail::Access::impl(*rt), "rpc.simulate");
  std::vector<std::shared_ptr<AgentCore>> cores;
  std::vector<caf::actor> actors;
  for (int r = 0; r < n; ++r) {
    cores.push_back(detail::make_core(sys, names[static_cast<std::size_t>(r)], r, n, options.rpc));
    cores.back()->names = names;
    actors.push_back(cores.back()->handle());
    std::weak_ptr<AgentCore> weak = cores.back();
    dopt::detail::runtime_add_stopper(dopt::detail::Access::impl(*rt), [weak] {
      if (auto c = weak.lock()) c->stop(true);
    });
  }
  for (auto& c : cores) detail::start_agent(sys, c, actors);
  actors.clear();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Agent agent(cores[static_cast<std::size_t>(r)]);
      try {
        fn(agent);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        agent.core()->stop(true);  // as if its process died: its peers see it
        return;
      }
      try {
        agent.shutdown();
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& c : cores) c->stop(true);
  cores.clear();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void run(const std::function<void(Agent&)>& fn, const RunOptions& options) {
  auto name_of = [&](int r) { return options.names ? options.names(r) : "worker" + std::to_string(r); };
  if (auto env = launch_env_from_environment()) {
    Runtime rt(options.runtime_options);
    Agent agent = init(rt, *env, name_of(env->rank), options.rpc);
    fn(agent);
    agent.shutdown();
    return;
  }
  SimulateOptions o;
  o.runtime_options = options.runtime_options;
  o.rpc = options.rpc;
  for (int r = 0; r < options.simulated_workers; ++r) o.names.push_back(name_of(r));
  simulate(options.simulated_workers, fn, o);
}

void run(const std::function<void(Agent&)>& fn, int simulated_workers) {
  RunOptions o;
  o.simulated_workers = simulated_workers;
  run(fn, o);
}

}  // namespace dopt::rpc
