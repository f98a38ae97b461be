#pragma once
// send and recv on the shared-memory plane (region.hpp describes the
// mailboxes). One engine per rank and group, a thread started on the first
// send or recv: it publishes sends (as many as the mailbox window allows, so
// that sends of different tags never wait for each other), copies the peers'
// headers out, matches them with recvs by (tag, sequence number), copies the
// bytes, acknowledges, and completes the futures. It sleeps on its doorbell,
// which peers ring when they publish or acknowledge.
//
// Between processes the bytes move once when the receiver can read the
// sender's memory (its cross-memory-attach probe of every member, made with
// the group, worked; ControlBlock::p2p_cma):
// the header carries the sender's tensor address and the receiver copies
// with process_vm_readv straight into its tensor. Otherwise (DOPT_SHM_CMA=0,
// or ptrace rules forbid it) the sender stages a copy in its send heap (or
// an arena segment when the heap is full) and the receiver copies it out.
//
// A send completes when the receiver copied the data (or refused it: dtype or
// shape mismatch, CollectiveMismatchError on both sides). Waits are bounded
// by the call's timeout (TimeoutError; a timed-out send is withdrawn) and by
// the peer's liveness (PeerLostError).
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dopt/runtime/internal/shm.hpp"
#include "dopt/actors/internal/op.hpp"
#include "plane/peer_table.hpp"
#include "transport/shm/channel.hpp"

namespace dopt::detail::shm_plane {

class P2PEngine {
 public:
  /// ch: the group's channel (only its regions and members are used here,
  /// never its rounds, so collectives and send/recv run side by side).
  explicit P2PEngine(const Channel& ch);
  ~P2PEngine();
  P2PEngine(const P2PEngine&) = delete;
  P2PEngine& operator=(const P2PEngine&) = delete;

  /// A send or recv of this rank; the future completes as described above.
  Future<void> post(const OpPtr& op);
  /// Fails every pending and later call with StateError(why).
  void stop(const std::string& why);

 private:
  struct State;
  std::shared_ptr<State> s_;
  std::thread thread_;
};

}  // namespace dopt::detail::shm_plane
