#pragma once
// The messages between rank actors (the actor plane and the control plane),
// their serialised forms, and the atoms that name them. Includes CAF.
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "caf/all.hpp"
#include "dopt/runtime/internal/tcp_transport.hpp"
#include "plane/failure.hpp"
#include "dopt/actors/internal/op.hpp"
#include "plane/peer_table.hpp"

namespace dopt::detail {

// Between simulated ranks (one process) the messages carry tensor handles
// and are never serialised. Between processes (the TCP plane) the Net* forms
// travel instead: descriptors, and the bytes of small buffers (large ones go
// over the TCP mesh).

/// "I (group rank from) have called collective (gid, seq) with desc; my buffers are tensors."
struct Arrival {
  std::uint64_t gid = 0;
  std::uint64_t seq = 0;
  int from = 0;  // group rank
  std::shared_ptr<const std::vector<int>> members;
  CollDesc desc;
  std::vector<Tensor> tensors;
};
using ArrivalPtr = std::shared_ptr<const Arrival>;

struct P2PKey {
  std::uint64_t gid = 0;
  int src = 0;  // global ranks
  int dst = 0;
  int tag = 0;
  std::uint64_t seq = 0;
  auto tie() const { return std::tie(gid, src, dst, tag, seq); }
  bool operator<(const P2PKey& o) const { return tie() < o.tie(); }
};

struct P2PArrival {
  P2PKey key;
  CollDesc desc;
  Tensor tensor;
  bool over_mesh = false;  // tcp: the bytes come on the mesh, not in `tensor`
};
using P2PArrivalPtr = std::shared_ptr<const P2PArrival>;

struct P2PReply {
  P2PKey key;
  bool failed = false;
  Failure failure;
};

/// One buffer of a Net* message (index = the tensor's index in the Op).
struct NetBuf {
  bool present = false;  // false: peers never touch this tensor
  DType dtype = DType::float32;
  Shape shape;
  bool over_mesh = false;  // the bytes follow on the TCP mesh, not in `data`
  std::uint64_t bytes = 0;
  std::vector<char> data;  // inline bytes (small messages)
};

struct NetArrival {
  std::uint64_t gid = 0;
  std::uint64_t seq = 0;
  int from = 0;
  std::vector<int> members;
  CollDesc desc;
  std::vector<NetBuf> bufs;
};

struct NetP2P {
  P2PKey key;
  CollDesc desc;
  NetBuf buf;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CollDesc& x) {
  return f(caf::meta::type_name("dopt.CollDesc"), x.kind, x.op, x.dtype, x.shape, x.root, x.extra, x.order,
           x.pre_divisor, x.caller);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, P2PKey& x) {
  return f(caf::meta::type_name("dopt.P2PKey"), x.gid, x.src, x.dst, x.tag, x.seq);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Failure& x) {
  return f(caf::meta::type_name("dopt.Failure"), x.kind, x.op, x.msg);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, P2PReply& x) {
  return f(caf::meta::type_name("dopt.P2PReply"), x.key, x.failed, x.failure);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NetBuf& x) {
  return f(caf::meta::type_name("dopt.NetBuf"), x.present, x.dtype, x.shape, x.over_mesh, x.bytes, x.data);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NetArrival& x) {
  return f(caf::meta::type_name("dopt.NetArrival"), x.gid, x.seq, x.from, x.members, x.desc, x.bufs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NetP2P& x) {
  return f(caf::meta::type_name("dopt.NetP2P"), x.key, x.desc, x.buf);
}

struct Peers {
  std::vector<caf::actor> actors;  // index: global rank
  std::shared_ptr<PeerTable> table;  // what the data planes' waits read
};
using PeersPtr = std::shared_ptr<const Peers>;
/// What a ring collective's completion tells its rank actor (local message).
struct RingResult {
  std::uint64_t gid = 0;
  std::uint64_t seq = 0;
  std::exception_ptr error;
};
using RingResultPtr = std::shared_ptr<const RingResult>;

}  // namespace dopt::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::ArrivalPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::P2PArrivalPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::PeersPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::OpPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::RingResultPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<dopt::transport::TcpMesh>)

namespace dopt::detail {

// User thread -> own rank actor.
using call_atom = caf::atom_constant<caf::atom("call")>;      // (call, Op): a collective or send/recv
using failed_atom = caf::atom_constant<caf::atom("failed")>;  // (failed, what): this rank's user code failed
// Set-up.
using init_atom = caf::atom_constant<caf::atom("init")>;        // (init, Peers): simulated ranks
using initnet_atom = caf::atom_constant<caf::atom("initnet")>;  // (initnet, Peers, peer timeout, mesh): processes
// Rank actor -> rank actor: collectives.
using arrive_atom = caf::atom_constant<caf::atom("arrive")>;  // (arrive, Arrival | NetArrival)
using done_atom = caf::atom_constant<caf::atom("done")>;      // (done, gid, seq): my share is written
using abort_atom = caf::atom_constant<caf::atom("abort")>;    // (abort, gid, from, why): the group is broken
// Between processes, small calls (relay.cpp): a lost member's arrival that
// reached some members only. (want, gid, seq, group rank, its global rank,
// asker): the asker (global rank) lacks that member's arrival; (have, gid,
// seq, group rank, answerer, has, NetArrival): the answer, with the arrival
// when has.
using want_atom = caf::atom_constant<caf::atom("want")>;
using have_atom = caf::atom_constant<caf::atom("have")>;
// Rank actor -> rank actor: point to point.
using p2p_atom = caf::atom_constant<caf::atom("p2p")>;          // (p2p, P2PArrival | NetP2P): a send
using p2pdone_atom = caf::atom_constant<caf::atom("p2pdone")>;  // (p2pdone, P2PReply): received (or refused)
using p2pcncl_atom = caf::atom_constant<caf::atom("p2pcncl")>;  // (p2pcncl, key): the sender timed out
// Liveness (control plane).
using lost_atom = caf::atom_constant<caf::atom("lost")>;  // (lost, rank, what): its user code failed
// (gone, rank, what, certain): its process is lost; certain: known (its
// connection closed), not only suspected (silence) (PeerTable::mark).
using gone_atom = caf::atom_constant<caf::atom("gone")>;
using hb_atom = caf::atom_constant<caf::atom("hb")>;      // (hb, rank): heartbeat
// (fence, rank, why): the sender had declared the receiver lost and heard
// from it again: the receiver was removed and must not go on.
using fence_atom = caf::atom_constant<caf::atom("fence")>;
// Growing back (issue 45, docs/growing-back-processes.md "Between processes").
// (revive, rank, incarnation, actor, mesh endpoint, timeout ms) replacement ->
// member: the lost rank's replacement waits for a grow(); the member connects
// its TCP mesh to the endpoint ("" when the replacement has no mesh) within
// the timeout. Answers "" or why not.
using revive_atom = caf::atom_constant<caf::atom("revive")>;
// (setmesh, mesh) a replacement's init_process_group -> own rank actor, once
// every member connected to its TCP mesh: the large buffers go over it.
using setmesh_atom = caf::atom_constant<caf::atom("setmesh")>;
// (revivenow, rank, timeout ms) user thread (grow() admitted it) -> own rank
// actor: revive the replacement's slot once it waits here (within the
// timeout: the leader may have seen it first); answers "" or why not.
using revivenow_atom = caf::atom_constant<caf::atom("revivenow")>;
// (admit, text) grow()'s leader's rank actor -> a newcomer's: the grown
// group ("GID MEMBER,MEMBER,... JOINED,JOINED,..."), kept until asked for.
using admit_atom = caf::atom_constant<caf::atom("admit")>;
// (admitwait) user thread -> own rank actor: the admission, once it came.
using admitwait_atom = caf::atom_constant<caf::atom("admitwait")>;
// (admitsend, rank, text) user thread -> own rank actor: send admit to rank.
using admitsend_atom = caf::atom_constant<caf::atom("admitsend")>;
// Rank actor -> itself.
using tmo_atom = caf::atom_constant<caf::atom("tmo")>;            // (tmo, gid, seq): a call's timeout
using p2ptmo_atom = caf::atom_constant<caf::atom("p2ptmo")>;      // (p2ptmo, key, is_send)
using hbtick_atom = caf::atom_constant<caf::atom("hbtick")>;      // time to send heartbeats and check silence
using ringdone_atom = caf::atom_constant<caf::atom("ringdone")>;  // (ringdone, RingResult): a TCP ring finished
using p2precv_atom = caf::atom_constant<caf::atom("p2precv")>;    // (p2precv, key, error): TCP bytes received

}  // namespace dopt::detail
