#pragma once
// dopt::rpc membership agreement: after a worker is lost, the workers that act
// together (a "line": e.g. a DistributedOptimizer's trainer, owners and buddy
// owners) agree on who is gone, under a new epoch (docs/rpc.md,
// "Membership"; docs/fault-tolerance-optimizers.md).
//
//   rpc::Membership m = rpc::agree_membership(agent, line, {0, 1, 2, 3});
//   // m.members: the survivors of {0, 1, 2, 3}; m.lost: the others; m.epoch
//
// Contract
//   * A line is a 64-bit id chosen by its coordinator, unique among the lines
//     of the job (DistributedOptimizer: the trainer's rank in the top 16 bits
//     and a counter). Every worker keeps, per line, the epoch and members it
//     last committed (membership_epoch(); 0 and no members before the first
//     agreement).
//   * agree_membership is called by one worker of the line, the coordinator
//     (it must be in `members`), on a user thread (it blocks); the other
//     members take part through two registered functions run on their pools
//     (no code of theirs is involved). It:
//       1. asks every member it does not know lost for the workers that
//          member saw lost (its agent's view: the same one that fails calls
//          with PeerLostError), and takes the union; a member that does not
//          answer because it was lost joins the lost; repeated until a round
//          adds nobody;
//       2. commits epoch e + 1 (e: the highest epoch any member had for the
//          line) with the survivors on every survivor, itself included. A
//          member commits only once its own agent sees every lost worker
//          lost (waiting up to `timeout` for the verdict): from then on it
//          drops every request from them, so no message of the old
//          membership reaches it after the new epoch (requests it took
//          before are ahead of any request of the new epoch in a value's
//          strand). A member lost while committing joins the lost and the
//          round starts again (under a higher epoch).
//     It returns the committed membership, or throws PeerLostError when no
//     agreement was reached (every round lost a member: at most
//     members.size() rounds), TimeoutError when a member did not see a lost
//     worker lost within `timeout`, StateError when a member already had a
//     higher epoch than the one proposed (two coordinators on one line).
//   * Callers carry the epoch in their own messages and compare it with
//     membership_epoch() on the receiving side to refuse a message of an
//     older membership (DistributedOptimizer does).
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "dopt/actors/rpc.hpp"

namespace dopt::rpc {

struct Membership {
  std::uint64_t line = 0;
  std::uint64_t epoch = 0;
  /// The survivors (ranks, ascending).
  std::vector<int> members;
  /// The workers of `members` (as passed) that were lost, ascending.
  std::vector<int> lost;
};

struct MembershipOptions {
  /// Deadline of each message, and of a member's wait for its own verdict
  /// on a lost worker; empty: the agent's rpc_timeout.
  std::optional<std::chrono::milliseconds> timeout;
};

/// See the contract above. Blocks; call it from a user thread.
Membership agree_membership(const Agent& coordinator, std::uint64_t line, const std::vector<int>& members,
                            const MembershipOptions& options = {});

/// The epoch this worker last committed for `line` (0: none yet).
std::uint64_t membership_epoch(const Agent& agent, std::uint64_t line);
/// The members this worker last committed for `line` (empty: none yet).
std::vector<int> membership_members(const Agent& agent, std::uint64_t line);
/// Drops this worker's record of `line` (e.g. when the object the line
/// served is destroyed).
void forget_membership(const Agent& agent, std::uint64_t line);

/// The workers this agent has seen lost (ascending): its pending calls to
/// them failed with PeerLostError, later calls fail at once.
std::vector<int> lost_workers(const Agent& agent);

/// Registers the functions the members run ("dopt.rpc.membership.*").
/// Idempotent; agree_membership calls it, and so must every process whose
/// workers take part before any agreement reaches them (DistributedOptimizer
/// does it at static initialisation).
void register_membership_functions();

}  // namespace dopt::rpc
