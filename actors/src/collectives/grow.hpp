#pragma once
// Internal to dopt_actors: what simulate() sets up for ProcessGroup::grow
// and join_group (grow.cpp) between the ranks of a deterministic simulation.
#include <cstdint>
#include <string>

#include "plane/peer_table.hpp"

namespace dopt::detail {

/// simulate() (deterministic, with newcomers), on its own thread: opens the
/// lobby where the run's newcomers wait in join_group() and its members find
/// them in grow(), keyed by the run's peer table, with the job's credentials
/// (SimulateOptions::job_id, ::secret). Closed (everything the run's grows
/// left in it dropped) by close_grow_lobby once the ranks have ended.
void open_grow_lobby(const PeerTable* peers, std::string job_id, std::string secret);
void close_grow_lobby(const PeerTable* peers);

/// The id of the one-member group that carries a newcomer's plane until it
/// joins (its world() handle's plane): never an id of new_group (small) nor
/// of shrink or grow (top bit set).
constexpr std::uint64_t newcomer_gid(int global_rank) {
  return (std::uint64_t{1} << 61) + static_cast<std::uint64_t>(global_rank);
}

}  // namespace dopt::detail
