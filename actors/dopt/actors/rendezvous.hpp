#pragma once
// Rendezvous of real processes (one rank per process), over CAF's middleman.
//
// Protocol (control plane only; tensors never travel here):
//  * every rank spawns one rendezvous actor in its Runtime; rank 0's actor is
//    also the coordinator and listens on MASTER_PORT, on the address
//    net::choose_bind_address(env) picks (not every interface unless asked);
//  * every connection first passes dopt's handshake (dopt/runtime/
//    handshake.hpp): the same job id (env.job_id) and, when env.secret is
//    set, proof of the secret; only then does CAF's middleman see the socket;
//  * ranks != 0 connect to MASTER_ADDR:MASTER_PORT, retrying every 50 ms until
//    the timeout while nothing listens there yet (or the name does not
//    resolve yet);
//  * every rank (rank 0 too) registers (rank, world_size, its actor);
//  * the coordinator checks each registration: a world size that differs from
//    rank 0's, or a rank that registered already, fails the whole rendezvous
//    (every waiting and every later rank gets the same error). Once all
//    world_size ranks arrived it replies to all with the full table;
//  * a barrier closes it, so nobody returns before everybody has the table;
//  * rank 0 keeps listening until its Runtime shuts down and turns every later
//    process away in the handshake ("the world is already closed ... rank r
//    is already taken").
//
// Errors (op "rendezvous", rank = this process's rank):
//  * ValueError   a world size that differs from rank 0's, a duplicate rank
//                 (the message names the rank(s)); refused by rank 0: another
//                 job (both job ids named), the world already closed;
//  * AuthenticationError  the secret is missing on one side or differs;
//  * IOError      rank 0 cannot listen on MASTER_PORT (e.g. already in use);
//                 MASTER_PORT answers with something that is not dopt;
//  * TimeoutError not all ranks arrived within the timeout; the message names
//                 the missing ranks ("missing ranks: 1, 3"). A rank that
//                 cannot reach rank 0 in time says so. MASTER_PORT accepted
//                 the connection but did not answer the handshake within
//                 env.handshake_timeout (another program holds the port);
//  * PeerLostError (barrier) a rank reported that it failed while the ranks
//                 connected to each other (init_process_group).
// No CAF types appear in this header.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/runtime.hpp"
#include "dopt/runtime/launch_env.hpp"

namespace dopt {

/// What rendezvous() returns: this rank's place and the table of every
/// rank's rendezvous actor (index: rank). Holds the actors alive; they exit
/// when the last copy is destroyed or when the Runtime shuts down.
class RendezvousResult {
 public:
  /// The rendezvous state (opaque: defined and used by the library only).
  struct Impl;
  /// The library's own access to the private constructor and state (opaque).
  struct Access;

  int rank() const noexcept;
  int world_size() const noexcept;
  /// The port rank 0 listens on (MASTER_PORT).
  int master_port() const noexcept;
  /// Printable identity of rank r's actor ("<actor id>@<node id>"), the same
  /// in every process. Throws ValueError for r outside [0, world_size).
  std::string peer(int r) const;
  /// Blocks until every rank called barrier() the same number of times.
  /// Throws TimeoutError (naming the ranks that did not arrive) after timeout,
  /// PeerLostError when rank 0 is gone, StateError after Runtime shutdown.
  void barrier(std::chrono::milliseconds timeout = std::chrono::seconds(300)) const;

 private:
  explicit RendezvousResult(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl& impl() const { return *impl_; }
  std::shared_ptr<Impl> impl_;
};

struct RendezvousOptions {
  /// Bounds the whole rendezvous, connecting included.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

/// Joins the world described by env (see the top of this file).
RendezvousResult rendezvous(Runtime& runtime, const LaunchEnv& env, const RendezvousOptions& options = {});

}  // namespace dopt
