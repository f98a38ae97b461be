#pragma once
// Rendezvous of real processes (one rank per process), over CAF's middleman.
//
// Protocol (control plane only; tensors never travel here):
//  * every rank spawns one rendezvous actor in its Runtime; rank 0's actor is
//    also the coordinator and is published on MASTER_PORT (all interfaces);
//  * ranks != 0 connect to MASTER_ADDR:MASTER_PORT, retrying every 50 ms until
//    the timeout while rank 0 is not up yet;
//  * every rank (rank 0 too) registers (rank, world_size, its actor);
//  * the coordinator checks each registration: a world size that differs from
//    rank 0's, or a rank that registered already, fails the whole rendezvous
//    (every waiting and every later rank gets the same error). Once all
//    world_size ranks arrived it replies to all with the full table;
//  * a barrier closes it, so nobody returns before everybody has the table.
//
// Errors (op "rendezvous", rank = this process's rank):
//  * ValueError   a world size that differs from rank 0's, a duplicate rank
//                 (the message names the rank(s));
//  * IOError      rank 0 cannot listen on MASTER_PORT (e.g. already in use);
//  * TimeoutError not all ranks arrived within the timeout; the message names
//                 the missing ranks ("missing ranks: 1, 3"). A rank that
//                 cannot reach rank 0 in time says so.
// No CAF types appear in this header.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/runtime.hpp"
#include "dopt/runtime/launch_env.hpp"

namespace dopt {

namespace detail {
struct RendezvousImpl;
}

/// What rendezvous() returns: this rank's place and the table of every
/// rank's rendezvous actor (index: rank). Holds the actors alive; they exit
/// when the last copy is destroyed or when the Runtime shuts down.
class RendezvousResult {
 public:
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

  /// Internal (CAF-facing) part.
  detail::RendezvousImpl& impl() const { return *impl_; }
  explicit RendezvousResult(std::shared_ptr<detail::RendezvousImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<detail::RendezvousImpl> impl_;
};

/// Joins the world described by env (see the top of this file). timeout
/// bounds the whole rendezvous, connecting included.
RendezvousResult rendezvous(Runtime& runtime, const LaunchEnv& env,
                            std::chrono::milliseconds timeout = std::chrono::seconds(300));

}  // namespace dopt
