#pragma once
// dopt::simulate: run a distributed function with simulated ranks in one process.
//
//   dopt::simulate(4, [](dopt::RankContext& ctx) {
//     auto t = dopt::Tensor::full({8}, ctx.rank());
//     ctx.world().all_reduce(t);             // every rank: 0+1+2+3
//   });
//
// fn runs once per rank, each call on its own std::thread (deterministic: a
// task of the simulation's scheduler, thousands on one OS thread; see
// dopt/actors/sim.hpp), each rank talking to its own rank actor. simulate returns when every rank's fn has returned or
// thrown. If any threw, simulate rethrows the first exception (in the order
// they were caught) after all ranks finished: a dopt::Error keeps its type and
// gains the rank (Error::rank()); any other exception becomes a dopt::Error
// ("simulate [rank r]: ..."). A rank that throws is reported to its peers:
// their calls that still wait for it fail with PeerLostError naming it, so a
// failing rank does not hang the others.
//
// A rank whose fn *returns* while its peers still wait for it is not an error
// of that rank; the peers' calls end with TimeoutError after the group timeout.
//
// With options.deterministic (or DOPT_SIM_SEED set) the threads run one at a
// time in an order drawn from options.seed, in virtual time, with the faults
// of options.faults: dopt/actors/sim.hpp has the contract, docs/testing.md
// the guide.
#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "dopt/actors/process_group.hpp"
#include "dopt/actors/runtime.hpp"
#include "dopt/actors/sim.hpp"

namespace dopt {

struct SimulateOptions {
  /// Runtime to use; null: simulate starts (and stops) its own with `runtime_options`.
  Runtime* runtime = nullptr;
  RuntimeOptions runtime_options = RuntimeOptions::from_env();
  /// Timeout of the world group (and default of its subgroups); empty: runtime's.
  std::optional<std::chrono::milliseconds> timeout;
  /// How the ranks' collectives move data: "shm" (lock-free slots in this
  /// process's memory, run by the calling threads; the default) or "actor"
  /// (messages between the rank actors). The environment variable
  /// DOPT_PLANE overrides it. Results are bitwise the same.
  std::string plane = "shm";

  /// Deterministic simulation (dopt/actors/sim.hpp, docs/testing.md): one
  /// thread runs at a time, the next one chosen at every collective, send,
  /// recv and future wait by a generator seeded with `seed`; time is
  /// virtual. DOPT_SIM_SEED in the environment turns it on with its seed.
  bool deterministic = false;
  std::uint64_t seed = 0;
  /// Faults to inject (deterministic only; else ValueError).
  FaultPlan faults;
  /// When set, filled with what the run did (trace hash, faults, virtual time).
  SimReport* report = nullptr;
  /// Keep the trace's lines in `report` (for comparing runs; costs memory).
  bool keep_trace = false;
  /// Deterministic only: collectives and sends take the virtual time of
  /// this network (sim::NetworkModel); absent: no time unless a fault delays.
  std::optional<sim::NetworkModel> network;

  /// Newcomers for ProcessGroup::grow (deterministic only, else
  /// ValueError): this many more ranks, global ranks world_size, ...,
  /// world_size + newcomers - 1. Their fn starts with the others' and sees
  /// RankContext::newcomer() true; their world() is a handle of the job they
  /// are not members of, which they pass to join_group() when they want in
  /// (it waits until the members grow()). The world group stays ranks
  /// 0..world_size-1.
  int newcomers = 0;
  /// The job's identity and secret that join_group() must present (JoinGroupOptions).
  std::string job_id = {};
  std::string secret = {};
};

class RankContext {
 public:
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  /// The group of all ranks.
  ProcessGroup& world() noexcept { return world_; }

  /// A newcomer (SimulateOptions::newcomers): not a member of world(); it joins with world().join_group().
  bool newcomer() const noexcept { return newcomer_; }

  RankContext(int rank, int world_size, ProcessGroup world, bool newcomer = false)
      : rank_(rank), world_size_(world_size), world_(std::move(world)), newcomer_(newcomer) {}

 private:
  int rank_;
  int world_size_;
  ProcessGroup world_;
  bool newcomer_ = false;
};

/// Runs fn for ranks 0..world_size-1 (see header). world_size >= 1, else ValueError.
void simulate(int world_size, const std::function<void(RankContext&)>& fn,
              const SimulateOptions& options = {});

}  // namespace dopt
