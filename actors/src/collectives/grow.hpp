#pragma once
// Internal to dopt_actors: what simulate() sets up for ProcessGroup::grow
// and join_group (grow.cpp) between the ranks of a deterministic simulation.
#include <atomic>
#include <chrono>
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

class RankEndpoint;

/// Between processes, how grow() and join_group() (grow.cpp) reach this
/// process's rank actor, which collectives/ cannot name: installed by
/// init_process_group (core/replacement.cpp, install_admission_post), null
/// until then (deterministic simulations use the lobby instead).
struct AdmissionPost {
  /// grow()'s leader (user thread): tells newcomer `to` its admission
  /// (`text`, grow.cpp's encoding) through the rank actors. Non-blocking.
  using Send = void (*)(RankEndpoint& ep, int to, const std::string& text);
  /// join_group() (user thread): blocks until the admission grow()'s leader
  /// sent arrives (its text), or returns "" after `timeout`. StateError once
  /// the runtime shut down; PeerLostError (op, me) as soon as every other
  /// rank of the job is lost to this one (the job ended: nobody can send it).
  using Wait = std::string (*)(RankEndpoint& ep, std::chrono::milliseconds timeout, int me);
  /// Every member (user thread), once the members agreed to take rank
  /// `peer`'s waiting replacement: its rank actor revives the slot (blocks
  /// until it did). "" or why not.
  using Revive = std::string (*)(RankEndpoint& ep, int peer, std::chrono::milliseconds timeout);
  std::atomic<Send> send{nullptr};
  std::atomic<Wait> wait{nullptr};
  std::atomic<Revive> revive{nullptr};
};
AdmissionPost& admission_post();

/// The id of the one-member group that carries a newcomer's plane until it
/// joins (its world() handle's plane): never an id of new_group (small) nor
/// of shrink or grow (top bit set).
constexpr std::uint64_t newcomer_gid(int global_rank) {
  return (std::uint64_t{1} << 61) + static_cast<std::uint64_t>(global_rank);
}

}  // namespace dopt::detail
