#pragma once
// Internal to dopt_actors: the network model's virtual time for the calls of
// a deterministic simulation (SimulateOptions::network). The shared-memory
// plane calls model_call on the task that runs a call: ShmGroup::execute for
// a collective (every member, before the call's first round), ShmGroup::run
// and run_async for a send (the sender, before posting it; a recv is charged
// nothing: it ends when the send arrives). Outside a simulation with a
// network model it does nothing.
#include "dopt/actors/internal/op.hpp"
#include "dopt/actors/internal/sim_hooks.hpp"
#include "dopt/actors/sim.hpp"

namespace dopt::detail::sim {

/// model_call (declared in dopt/actors/internal/sim_hooks.hpp, for the
/// transports): the calling task sleeps the call's cost (network_cost.hpp)
/// in virtual time; group rank 0 (a send: the sender) adds its bytes per
/// link and its time to the run's report. A scheduling point.

/// ValueError naming what is wrong with m for world_size ranks (hosts < 1,
/// more ranks than hosts x ranks_per_host, a rate not positive).
void check_network(const dopt::sim::NetworkModel& m, int world_size);

}  // namespace dopt::detail::sim
