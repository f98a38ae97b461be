#pragma once
// Real ranks: one process per rank, joined into a world ProcessGroup.
//
//   dopt::Runtime rt;
//   auto env = dopt::launch_env_from_environment();   // set by dopt-run, torchrun, mpirun, srun
//   if (!env) { /* not started by a launcher: run_distributed below simulates instead */ }
//   dopt::ProcessGroup world = dopt::init_process_group(rt, *env);
//   world.all_reduce(t);
//
// init_process_group must be called once by every rank of the world (it is a
// collective: it returns on no rank before every rank has called it). It runs
// the rendezvous (rendezvous.hpp), spawns this process's rank actor, exchanges
// the rank actors and opens the data plane between the ranks (every
// connection behind dopt's handshake: the job id, and the secret when the job
// has one; docs/launching.md):
//   * ranks on the same host move tensors through POSIX shared memory;
//   * ranks on different hosts through Boost.Asio TCP connections;
//   * CAF's middleman carries only control messages (who arrived, which
//     buffer, done), never the tensors themselves.
// The returned group behaves exactly like the world group of simulate(): the
// same collectives, sequence numbers, mismatch errors and timeouts. When a
// peer process dies, every pending and later collective that needs it fails
// within the group's timeout with PeerLostError naming it.
//
// run_distributed(fn) is the common entry point of programs that run either
// way: launched by a launcher it runs fn once, as this process's rank; started
// alone it runs fn for `simulated_ranks` simulated ranks in this process.
#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "dopt/actors/process_group.hpp"
#include "dopt/actors/runtime.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/runtime/launch_env.hpp"

namespace dopt {

struct InitOptions {
  /// Bounds the rendezvous (connecting included). Connecting the ranks to
  /// each other afterwards is bounded by env.handshake_timeout
  /// (DOPT_HANDSHAKE_TIMEOUT_MS). The world group's timeout is the runtime's
  /// collective_timeout.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// "auto" (shared memory when every rank is on this host, else TCP),
  /// "shm" or "tcp". The environment variable DOPT_TRANSPORT overrides it.
  std::string transport = "auto";
  /// What a process that joins this job while it runs (a node of `dopt-run
  /// --nnodes MIN:MAX` that comes later, a lost rank's replacement) must
  /// have in common with it, as the program declares it: key -> value, e.g.
  /// {"--hidden", "64"} for every flag that decides which collectives a step
  /// makes. Every rank declares the same items. Rank 0 compares a newcomer's
  /// items, and the launch facts dopt adds itself (WORLD_SIZE,
  /// LOCAL_WORLD_SIZE, DOPT_MIN_WORLD_SIZE), with its own when it admits it:
  /// on a difference it refuses the newcomer, whose init_process_group
  /// throws ValueError naming each differing item with both values ("--hidden:
  /// the job has 64, this node 32"), and the job goes on without it. A job
  /// that declares nothing (empty on rank 0) compares the launch facts only.
  /// The ranks that start the job are not compared. ValueError for an empty
  /// key or a launch fact's name.
  std::map<std::string, std::string> compatibility;
};

/// Joins the world described by env and returns its world group (see above).
/// Throws like rendezvous(), and ValueError for an unknown transport.
ProcessGroup init_process_group(Runtime& runtime, const LaunchEnv& env, const InitOptions& options = {});

struct RunOptions {
  /// Ranks to simulate when the process was not started by a launcher.
  int simulated_ranks = 1;
  InitOptions init;
  /// Options of the runtime that run_distributed starts.
  RuntimeOptions runtime_options = RuntimeOptions::from_env();
};

/// Runs fn as this process's rank (launched) or for every simulated rank
/// (not launched); rethrows the first failure like simulate().
void run_distributed(const std::function<void(RankContext&)>& fn, const RunOptions& options = {});

}  // namespace dopt
