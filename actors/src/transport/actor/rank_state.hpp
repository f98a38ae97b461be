#pragma once
// The rank actor: one per rank, the rank's presence in the control plane
// (rendezvous handles, liveness of its peers, failure propagation) and the
// actor plane, where the collective protocol runs as messages between rank
// actors (simulated ranks under DOPT_PLANE=actor and the deterministic
// protocol tests: tensors by reference; processes on several hosts: small
// buffers inline, large ones as ring collectives on the TCP mesh).
//
// Its state machines, by file:
//   rank_actor.cpp    the behaviour: which message runs what
//   liveness.cpp      lost peers, heartbeats, this rank's own failure
//   collectives.cpp   matching arrivals by (group, seq), mismatch, timeouts, aborts
//   direct.cpp        the work split on addressable buffers
//   p2p.cpp           send/recv matching
//   tcp_plane.cpp     collectives and sends whose bytes go over the TCP mesh
//   relay.cpp         net small calls: a lost member's arrival that reached some members only
//
// Threads: a rank actor runs on CAF's workers, one message at a time; it
// never blocks. Users reach it through RankEndpoint::post (call messages).
#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "transport/actor/messages.hpp"

namespace dopt::detail {

/// Between processes, buffers of at most this many bytes travel inside the
/// control message, and every rank computes its whole result itself (no done
/// phase): latency wins. Larger ones go over the TCP mesh.
inline constexpr std::int64_t kSmallBytes = 64 * 1024;

/// Net: whether a call of desc goes inline (small) rather than over the mesh.
inline bool small_call(const CollDesc& d) {
  return shape_numel(d.shape) * static_cast<std::int64_t>(itemsize(d.dtype)) <= kSmallBytes;
}

/// Whether peers read (or write) tensor i of an Op of this kind.
inline bool shared_with_peers(CollKind k, std::size_t i, bool is_root) {
  switch (k) {
    case CollKind::broadcast: return i == 0 && is_root;
    case CollKind::all_reduce:
    case CollKind::reduce:
    case CollKind::all_gather:
    case CollKind::all_gather_flat:
    case CollKind::send: return i == 0;
    case CollKind::reduce_scatter: return i >= 1;
    default: return false;
  }
}

/// How often a rank actor sends heartbeats and checks its peers' silence.
inline std::chrono::milliseconds heartbeat_period(std::chrono::milliseconds peer_timeout) {
  return std::max(std::chrono::milliseconds(10), peer_timeout / 10);
}

inline bool needs_done_phase(CollKind k) { return k != CollKind::barrier && k != CollKind::new_group; }

/// The exception being handled, as a dopt::Error (others wrapped, naming op and rank).
std::exception_ptr current_as_error(const std::string& op, int rank);

using CollKey = std::pair<std::uint64_t, std::uint64_t>;  // (gid, seq)

/// One collective of one group on this rank, from the first message about it
/// (the local call or a peer's arrival) until it completes here.
struct CollState {
  OpPtr local;
  std::shared_ptr<const std::vector<int>> members;
  std::vector<ArrivalPtr> arrivals;  // index: group rank
  int n_arrived = 0;
  int n_done = 0;
  bool computed = false;
  bool small = false;  // net: inline bytes, each rank computes all of its result
  bool ring = false;   // tcp: the data moves in a ring collective on the mesh
  /// Net small calls: group rank of a lost member whose arrival is asked for
  /// (relay.cpp) -> the global ranks that have not answered yet.
  std::map<int, std::set<int>> asked;
  /// Every member answered no: group rank -> the heartbeat tick then. The
  /// call fails once no copy can still be on its way here either.
  std::map<int, std::uint64_t> closing;
};

struct RankState {
  caf::event_based_actor* self = nullptr;
  int rank = 0;
  int world = 0;
  PeersPtr peer_set;  // every rank's actor, shared by the ranks of one process
  const caf::actor& actor_of(int r) const { return peer_set->actors[static_cast<std::size_t>(r)]; }
  /// Local worlds: peers monitored so far (watch). Net: every peer, from the start.
  std::vector<bool> watched;
  std::shared_ptr<PeerTable> table;          // liveness as the data planes see it
  bool net = false;                          // peers are other processes
  std::shared_ptr<transport::TcpMesh> mesh;  // tcp: connections to every peer
  std::map<P2PKey, Tensor> send_hold;        // tcp: send buffers until the reply
  // net: liveness. A process that dies closes its connections (CAF's down_msg
  // tells at once); one that is stopped or cut off only falls silent.
  std::chrono::milliseconds peer_timeout{0};
  std::vector<std::chrono::steady_clock::time_point> last_heard;
  std::chrono::steady_clock::time_point last_tick;  // when the last heartbeat tick ran
  std::chrono::steady_clock::time_point doubt_until;  // in_doubt
  std::chrono::milliseconds doubt_gap{0};             // the gap that started the doubt

  std::map<CollKey, CollState> colls;
  std::set<CollKey> failed;                 // failed here; late messages are dropped
  std::map<std::uint64_t, Failure> broken;  // group -> why it is unusable
  std::map<int, std::string> lost;          // global rank -> why
  std::vector<int> lost_order;              // the order in which they were lost
  std::set<int> dead;                       // global ranks whose actor is gone
  bool self_failed = false;
  std::string self_failed_what;
  bool removed = false;  // out of the job: fenced by a peer that had declared it lost (remove_self)

  // Net small calls (relay.cpp): the arrivals of each group's latest
  // completed calls (gid -> (seq, arrivals by group rank), oldest first),
  // and the (gid, seq, group rank) arrivals refused once asked for.
  std::map<std::uint64_t, std::deque<std::pair<std::uint64_t, std::vector<ArrivalPtr>>>> kept;
  std::set<std::tuple<std::uint64_t, std::uint64_t, int>> refused;
  // Questions (want) about an arrival that may still be on its way here:
  // (gid, seq, group rank) -> the lost member's global rank, the askers and
  // the heartbeat tick at which the first came.
  struct Deferred {
    int lost_rank = -1;
    std::set<int> askers;
    std::uint64_t tick = 0;
  };
  std::map<std::tuple<std::uint64_t, std::uint64_t, int>, Deferred> deferred;
  std::uint64_t ticks = 0;  // heartbeat ticks so far

  std::map<P2PKey, OpPtr> sends;              // my sends waiting for the receiver
  std::map<P2PKey, OpPtr> recvs;              // my recvs waiting for the sender
  std::map<P2PKey, P2PArrivalPtr> unmatched;  // sends to me without a recv yet
  std::map<P2PKey, OpPtr> tcp_recvs;          // tcp: recvs whose bytes are on the way

  // Growing back (transport/actor/revive.cpp).
  struct Waiting {
    int incarnation = 0;
    caf::actor actor;
  };
  std::map<int, Waiting> waiting;                // replacements of lost ranks until grow() takes them
  struct ReviveRequest {
    caf::response_promise promise;
    std::chrono::steady_clock::time_point until;
  };
  std::map<int, ReviveRequest> revive_requests;  // grow() took a rank whose replacement is not here yet
  std::string admission;                         // a newcomer's: what grow()'s leader sent
  std::optional<caf::response_promise> admission_waiter;  // join_group() waiting for it (admitwait)

  static const char* name;

  ~RankState();

  void fail(const OpPtr& op, const Failure& f) { op->promise.set_exception(to_exception(f, rank)); }
  caf::actor me() { return caf::actor_cast<caf::actor>(self); }
  int global_of(const CollState& st, int grank) const { return (*st.members)[static_cast<std::size_t>(grank)]; }

  // --- collectives (transport/actor/collectives.cpp, direct.cpp) ---------------------
  void on_call(OpPtr op);
  /// Net: the message for the peers (inline bytes of small buffers).
  caf::message make_net_arrival(CollState& st, const Op& op);
  Tensor net_tensor(NetBuf& b);
  /// relayed: a copy another member passed on (relay.cpp), taken even when
  /// the sender's own was refused.
  void on_net_arrive(NetArrival& na, bool relayed = false);
  void on_arrive(const ArrivalPtr& a);
  void on_done(std::uint64_t gid, std::uint64_t seq);
  void progress(CollKey key);
  /// This rank's part of the work, on direct-access buffers.
  void compute(const CollState& st);
  std::vector<int> missing(const CollState& st) const;
  void break_group(std::uint64_t gid, const Failure& why);
  void on_timeout(std::uint64_t gid, std::uint64_t seq);
  void on_abort(std::uint64_t gid, int from, const std::string& msg);

  // --- a lost member's arrival (transport/actor/relay.cpp) ------------------------------
  /// Net small call `key`, pending here, lacks the arrival of its lost group
  /// rank g: asks the members not known lost for it (once) and refuses the
  /// lost member's own copy from now on. false: nobody to ask (the call fails).
  bool ask_for_arrival(CollKey key, CollState& st, int g);
  /// A member asks for group rank g's (global lost_rank's) arrival of (gid,
  /// seq): the copy held here (pending or kept), at once. Without one, the
  /// answer waits while the copy may still be on its way here: until it
  /// comes (then the copy), or this rank's own verdict that lost_rank is gone
  /// (its connection closed, or silence: nothing more comes from it), or a
  /// heartbeat period after this rank learned of the loss otherwise (a peer
  /// told it); then no, and that arrival is refused here from then on.
  void on_want(std::uint64_t gid, std::uint64_t seq, int g, int lost_rank, int asker);
  /// Answers the questions waiting for (gid, seq, g): with `held`, or no.
  void answer_deferred(std::uint64_t gid, std::uint64_t seq, int g, const ArrivalPtr& held);
  /// Answers no to the waiting questions about `peer` (-1: any peer known
  /// lost), all of them or only those that waited a heartbeat period, and
  /// fails the closing calls that waited for such a peer's copy likewise.
  void settle_deferred(int peer, bool all);
  /// The answer of member `from`: a relayed arrival completes the call when
  /// it was the last one missing; the last "no" fails it.
  void on_have(std::uint64_t gid, std::uint64_t seq, int g, int from, bool has, NetArrival& na);
  /// Member `peer` was lost: it answers no more. Whether a call's asking is
  /// over with an arrival still missing (the call then fails).
  bool asking_ends(CollState& st, int peer);
  /// Every member asked answered no for group rank g: whether the call fails
  /// now (no copy can still come here); otherwise it waits (closing).
  bool no_copy_left(CollState& st, int g);
  /// A net small call completed: its arrivals (but this rank's own) are kept.
  void keep_arrivals(CollKey key, CollState& st);

  // --- the TCP mesh (transport/actor/tcp_plane.cpp) --------------------------------------
  void start_ring(CollKey key, CollState& st);
  void on_ring_done(const RingResult& r);
  static transport::Tag p2p_tag(const P2PKey& k);
  /// The error of a call (`who`) whose buffer needs the mesh where there is none.
  NotSupportedError no_mesh(const std::string& who) const;
  void on_p2p_received(const P2PKey& key, const std::string& error);

  // --- liveness (transport/actor/liveness.cpp) ------------------------------------------------
  Failure lost_failure_of(CollKey key, const CollState& st, int peer) const;
  void on_lost(int peer, const std::string& what, bool actor_dead, bool gone = false, bool pass_on = false,
               bool certain = true);
  void on_heartbeat_tick();
  void on_self_failed(const std::string& what);
  /// The rank of the peer whose rank actor is `who` (-1: none).
  int rank_of(const caf::strong_actor_ptr& who) const;
  /// Monitors `peer` unless it already is (its exit then reaches the down
  /// handler). Net ranks monitor every peer at init; the ranks of one process
  /// only the peers of their pending calls, when the call is made: a rank
  /// monitoring every other costs ranks x ranks monitors (and as many down
  /// messages when the world ends) for losses that, between threads or
  /// simulated ranks, only the end of the world brings.
  void watch(int peer);
  /// Word from a peer this rank declared lost (it was stopped or cut off,
  /// and came back): it is told it was removed; what it says counts for nothing.
  void fence(int peer);
  /// A peer declared this rank lost: it was removed (its waits fail, shrink refuses).
  void on_fenced(int by, const std::string& why);
  /// Net: true while losses cannot be certain here: within one peer timeout
  /// after this process was seen not to have run (no heartbeat tick) for
  /// longer than the peer timeout (stopped, starved). Its peers may have
  /// declared it lost meanwhile; all of them may also have been stopped
  /// with it (Ctrl-Z under dopt-run), so that alone removes nothing.
  bool in_doubt(std::chrono::steady_clock::time_point now);
  /// This rank is out of the job (why: the PeerTable's fenced()): every peer
  /// is lost to it, its calls fail and ProcessGroup::shrink refuses.
  void remove_self(const std::string& why);

  // --- growing back (transport/actor/revive.cpp) --------------------------------------
  /// Net: the replacement `who` of lost rank `peer` (a later incarnation)
  /// connected: it waits (heartbeats both ways, PeerTable::announce) until a
  /// grow() takes it; the rank stays lost meanwhile, so a shrink() still
  /// sees the loss. The TCP mesh (when there is one) connects to the
  /// replacement's at `endpoint` (when not "") within `timeout`, on a thread
  /// of the mesh's (TcpMesh::reconnect_peer). "" or why not.
  std::string announce(int peer, int incarnation, const caf::actor& who, const std::string& endpoint,
                       std::chrono::milliseconds timeout);
  /// grow() took waiting rank `peer`: the slot is alive again (peer handle,
  /// lost/dead sets, PeerTable, liveness). "" or why not. The TCP mesh's
  /// connection to it is the replacement's (announce).
  std::string revive(int peer);
  /// grow() (revivenow): revive(peer) now, or once its replacement waits
  /// here, within `timeout`.
  caf::result<std::string> revive_when_waiting(int peer, std::chrono::milliseconds timeout);
  /// A down message: a waiting replacement whose actor is `gone` died
  /// before a grow() took it, and waits no longer.
  void forget_waiting(const caf::actor_addr& gone);
  /// Word from `sender`, an older process of revived rank `peer`: it is
  /// told it was removed (as fence() tells a rank declared lost).
  void fence_stale(int peer, const caf::strong_actor_ptr& sender);
  void on_admission(std::string text);
  /// A newcomer's join_group() (admitwait): answers (admission, "") once
  /// grow()'s leader sent it, or ("", why) once no member is left to send
  /// it (members_gone); until then the promise waits in admission_waiter.
  caf::result<std::string, std::string> wait_admission();
  /// A newcomer: "" while some other rank of the job is not lost here (any
  /// member may lead the grow() that takes it); else why it waits in vain:
  /// the job ended (every member, rank 0 among them, is gone) or this rank
  /// was removed from it.
  std::string members_gone() const;
  /// After a loss: a join_group() waiting in vain (members_gone) is answered.
  void answer_admission_waiter();

  // --- point to point (transport/actor/p2p.cpp) -------------------------------------------
  Failure lost_failure(const char* op) const;
  void reply_lost(const P2PKey& key);
  void on_send(OpPtr op);
  void on_recv(OpPtr op);
  void on_net_p2p(NetP2P& np);
  void on_p2p(const P2PArrivalPtr& a);
  void match(const OpPtr& op, const P2PArrivalPtr& a);
  void on_p2p_done(const P2PReply& r);
  void on_p2p_timeout(const P2PKey& key, bool is_send);
  void on_p2p_cancel(const P2PKey& key) { unmatched.erase(key); }
};

/// The behaviour of a rank actor (transport/actor/rank_actor.cpp).
caf::behavior rank_actor(caf::stateful_actor<RankState>* self, int rank, int world);

}  // namespace dopt::detail
