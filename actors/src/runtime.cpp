// The only translation unit of dopt_actors that includes CAF: the embedded
// actor system (Runtime) and the rank actor with its collective state
// machines. See docs/architecture.md for the protocol.
#include "dopt/actors/runtime.hpp"

#include <algorithm>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <unistd.h>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/parallel.hpp"
#include "dopt/runtime/shm.hpp"
#include "rendezvous_internal.hpp"
#include "ring.hpp"
#include "dopt/runtime/tcp_transport.hpp"
#include "caf_thread.hpp"
#include "internal.hpp"
#include "world_setup.hpp"
#include "kernels.hpp"

namespace dopt::detail {

// --- messages between rank actors. Between simulated ranks (one process)
// they carry tensor handles and are never serialised. Between processes the
// Net* forms travel instead: descriptors, and for every buffer either its
// bytes (small messages) or where it lies in the sender's shared memory
// (see docs/architecture.md).

/// "I (group rank from) have called collective (gid, seq) with desc; my buffers are tensors."
struct Arrival {
  std::uint64_t gid = 0;
  std::uint64_t seq = 0;
  int from = 0;  // group rank
  std::shared_ptr<const std::vector<int>> members;
  CollDesc desc;
  std::vector<Tensor> tensors;
  /// Net: why this peer's buffers could not be mapped ("" when fine). Such an
  /// arrival is waited out: its sender's death (the usual cause: it exited
  /// and its shared memory went with it) or the timeout ends the call.
  std::string unreadable;
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

enum class FailKind : int { timeout = 1, peer_lost, mismatch, state };

struct Failure {
  FailKind kind = FailKind::state;
  std::string op;
  std::string msg;
};

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
  std::string segment;   // shared-memory block; "" when the bytes are inline
  std::uint64_t offset = 0;
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
  return f(caf::meta::type_name("dopt.CollDesc"), x.kind, x.op, x.dtype, x.shape, x.root, x.extra);
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
  return f(caf::meta::type_name("dopt.NetBuf"), x.present, x.dtype, x.shape, x.segment, x.offset, x.bytes, x.data);
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
};
using PeersPtr = std::shared_ptr<const Peers>;
using OpPtr = std::shared_ptr<Op>;

/// What a ring collective's completion tells its rank actor (local message).
struct RingResult {
  std::uint64_t gid = 0;
  std::uint64_t seq = 0;
  std::exception_ptr error;
  std::shared_ptr<void> keep;  // scratch the collective used
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

using init_atom = caf::atom_constant<caf::atom("init")>;
using call_atom = caf::atom_constant<caf::atom("call")>;
using arrive_atom = caf::atom_constant<caf::atom("arrive")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using lost_atom = caf::atom_constant<caf::atom("lost")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using tmo_atom = caf::atom_constant<caf::atom("tmo")>;
using p2p_atom = caf::atom_constant<caf::atom("p2p")>;
using p2pdone_atom = caf::atom_constant<caf::atom("p2pdone")>;
using p2ptmo_atom = caf::atom_constant<caf::atom("p2ptmo")>;
using p2pcncl_atom = caf::atom_constant<caf::atom("p2pcncl")>;
using initnet_atom = caf::atom_constant<caf::atom("initnet")>;
using gone_atom = caf::atom_constant<caf::atom("gone")>;
using fetched_atom = caf::atom_constant<caf::atom("fetched")>;
using ringdone_atom = caf::atom_constant<caf::atom("ringdone")>;
using p2precv_atom = caf::atom_constant<caf::atom("p2precv")>;
using hb_atom = caf::atom_constant<caf::atom("hb")>;
using hbtick_atom = caf::atom_constant<caf::atom("hbtick")>;

namespace {

std::exception_ptr to_exception(const Failure& f, int rank) {
  switch (f.kind) {
    case FailKind::timeout: return std::make_exception_ptr(TimeoutError(f.op, f.msg, rank));
    case FailKind::peer_lost: return std::make_exception_ptr(PeerLostError(f.op, f.msg, rank));
    case FailKind::mismatch:
      return std::make_exception_ptr(CollectiveMismatchError(f.op, f.msg, rank));
    case FailKind::state: break;
  }
  return std::make_exception_ptr(StateError(f.op, f.msg, rank));
}

std::exception_ptr current_as_error(const std::string& op, int rank) {
  try {
    throw;
  } catch (const Error& e) {
    return std::current_exception();
  } catch (const std::exception& e) {
    return std::make_exception_ptr(Error(op, e.what(), rank));
  } catch (...) {
    return std::make_exception_ptr(Error(op, "unknown exception", rank));
  }
}

std::string group_str(std::uint64_t gid) { return gid == 0 ? "world group" : "group " + std::to_string(gid); }

/// How a rank actor reaches its peers' buffers.
///   in_process: simulated ranks; an Arrival carries the peer's own tensors.
///   shm:        processes on one host; a rank stages the tensors its peers
///               read or write in its shared-memory arena, and peers map them.
/// In both, the direct algorithms of compute() read and write peers' buffers
/// in place; between hosts a ring over TCP takes their place.
enum class Plane : std::uint8_t { in_process, shm, tcp };


/// Tag hi word of a collective's messages on the mesh (ring.hpp): unique
/// among the calls in flight, the same on every rank. p2p messages set the
/// top bit.
std::uint64_t mesh_op_id(std::uint64_t gid, std::uint64_t seq) {
  std::uint64_t x = gid * 0x9E3779B97F4A7C15ULL + seq;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29;
  return x & ~(std::uint64_t{1} << 63);
}

/// Buffers of at most this many bytes travel inside the control message, and
/// every rank computes the whole result itself (no done phase): latency wins.
constexpr std::int64_t kSmallBytes = 64 * 1024;

/// Whether peers read (or write) tensor i of an Op of this kind.
bool shared_with_peers(CollKind k, std::size_t i, bool is_root) {
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

using CollKey = std::pair<std::uint64_t, std::uint64_t>;  // (gid, seq)

struct CollState {
  OpPtr local;
  std::shared_ptr<const std::vector<int>> members;
  std::vector<ArrivalPtr> arrivals;  // index: group rank
  int n_arrived = 0;
  int n_done = 0;
  bool computed = false;
  bool small = false;   // net: inline bytes, each rank computes all of its result
  bool staged = false;  // net: own arrival's tensors are shared-memory copies
  bool ring = false;    // tcp: the data moves in a ring collective on the mesh
};

bool needs_done_phase(CollKind k) { return k != CollKind::barrier && k != CollKind::new_group; }

struct RankState {
  caf::event_based_actor* self = nullptr;
  int rank = 0;
  int world = 0;
  std::vector<caf::actor> peers;
  Plane plane = Plane::in_process;
  std::unique_ptr<shm::ShmArena> arena;  // shm: blocks peers map
  std::shared_ptr<transport::TcpMesh> mesh;  // tcp: connections to every peer
  shm::ShmMapCache maps;                  // shm: peers' segments
  std::map<P2PKey, Tensor> send_hold;       // net: staged send buffers until the reply
  struct Held {
    Tensor staging;    // our staged copy of a finished all_reduce
    int expected = 0;  // peers that read from it (0: the call has not finished here yet)
    int fetched = 0;   // peers that said they are done reading
  };
  std::map<CollKey, Held> held;             // net: staged copies peers still read
  // net: liveness. A process that dies closes its connections (CAF's down_msg
  // tells at once); one that is stopped or cut off only falls silent.
  std::chrono::milliseconds peer_timeout{0};
  std::vector<std::chrono::steady_clock::time_point> last_heard;

  std::map<CollKey, CollState> colls;
  std::set<CollKey> failed;                   // failed here; late messages are dropped
  std::map<std::uint64_t, Failure> broken;    // group -> why it is unusable
  std::map<int, std::string> lost;            // global rank -> why
  std::vector<int> lost_order;                // the order in which they were lost
  std::set<int> dead;                         // global ranks whose actor is gone
  bool self_failed = false;
  std::string self_failed_what;

  std::map<P2PKey, OpPtr> sends;              // my sends waiting for the receiver
  std::map<P2PKey, OpPtr> recvs;              // my recvs waiting for the sender
  std::map<P2PKey, P2PArrivalPtr> unmatched;  // sends to me without a recv yet

  static const char* name;

  ~RankState() {
    Failure f{FailKind::state, "Runtime", "the runtime shut down before the operation finished"};
    for (auto& [k, st] : colls)
      if (st.local) fail(st.local, f);
    for (auto& [k, op] : sends) fail(op, f);
    for (auto& [k, op] : recvs) fail(op, f);
  }

  void fail(const OpPtr& op, const Failure& f) { op->promise.set_exception(to_exception(f, rank)); }

  caf::actor me() { return caf::actor_cast<caf::actor>(self); }

  int global_of(const CollState& st, int grank) const { return (*st.members)[static_cast<std::size_t>(grank)]; }

  // --- collectives -------------------------------------------------------------

  void on_call(OpPtr op) {
    if (op->desc.kind == CollKind::send) return on_send(std::move(op));
    if (op->desc.kind == CollKind::recv) return on_recv(std::move(op));
    const char* name_ = coll_name(op->desc.kind);
    if (auto it = broken.find(op->gid); it != broken.end()) {
      Failure f = it->second;
      f.op = name_;
      return fail(op, f);
    }
    CollKey key{op->gid, op->seq};
    auto& st = colls[key];
    if (st.local) {
      fail(op, Failure{FailKind::state, name_, "sequence number " + std::to_string(op->seq) + " used twice"});
      return;
    }
    st.local = op;
    st.members = op->members;
    const int n = static_cast<int>(op->members->size());
    st.arrivals.resize(static_cast<std::size_t>(n));
    // A member that was lost before arriving will never arrive (messages from
    // one actor arrive in order, and its 'lost' came after its arrivals).
    for (int g = 0; g < n; ++g) {
      int peer = global_of(st, g);
      if (!st.arrivals[static_cast<std::size_t>(g)] && lost.count(peer) && peer != rank) {
        Failure f{FailKind::peer_lost, name_,
                  "rank " + std::to_string(peer) + " was lost before it joined " + op->desc.str() + " in " +
                      group_str(op->gid) + " (seq " + std::to_string(op->seq) + "): " + lost[peer]};
        fail(op, f);
        colls.erase(key);
        failed.insert(key);
        return;
      }
    }
    auto a = std::make_shared<Arrival>();
    a->gid = op->gid;
    a->seq = op->seq;
    a->from = op->my_grank;
    a->members = op->members;
    a->desc = op->desc;
    a->tensors = op->tensors;
    std::optional<caf::message> net_msg;
    if (plane != Plane::in_process) {
      try {
        net_msg = make_net_arrival(st, *op, *a);
      } catch (...) {
        op->promise.set_exception(current_as_error(name_, rank));
        colls.erase(key);
        failed.insert(key);
        return;
      }
    }
    ArrivalPtr ap = a;
    st.arrivals[static_cast<std::size_t>(op->my_grank)] = ap;
    ++st.n_arrived;
    for (int g = 0; g < n; ++g) {
      int peer = global_of(st, g);
      if (peer == rank) continue;
      if (net_msg) self->send(peers[static_cast<std::size_t>(peer)], *net_msg);
      else self->send(peers[static_cast<std::size_t>(peer)], arrive_atom::value, ap);
    }
    self->delayed_send(me(), op->timeout, tmo_atom::value, op->gid, op->seq);
    progress(key);
  }

  /// Net: stages (or inlines) the buffers peers need; own arrival `a` gets
  /// the staged copies. Returns the message for the peers.
  caf::message make_net_arrival(CollState& st, const Op& op, Arrival& a) {
    NetArrival na;
    na.gid = op.gid;
    na.seq = op.seq;
    na.from = op.my_grank;
    na.members = *op.members;
    na.desc = op.desc;
    const bool small = shape_numel(op.desc.shape) * static_cast<std::int64_t>(itemsize(op.desc.dtype)) <= kSmallBytes;
    st.small = small;
    // Decided from the descriptor alone, so every rank takes the same path.
    st.ring = plane == Plane::tcp && !small && op.desc.has_tensor();
    const bool is_root = op.my_grank == op.desc.root;
    na.bufs.resize(op.tensors.size());
    for (std::size_t i = 0; i < op.tensors.size(); ++i) {
      if (!shared_with_peers(op.desc.kind, i, is_root)) continue;
      const Tensor& t = op.tensors[i];
      NetBuf& b = na.bufs[i];
      b.present = true;
      b.dtype = t.dtype();
      b.shape = t.shape();
      b.bytes = t.nbytes();
      if (small) {
        const char* p = static_cast<const char*>(t.data_ptr());
        b.data.assign(p, p + t.nbytes());
      } else if (st.ring) {
        b.present = false;  // the bytes go round the ring, not with the arrival
      } else {
        a.tensors[i] = stage(t, &b);
        st.staged = true;
      }
    }
    return caf::make_message(arrive_atom::value, std::move(na));
  }

  /// A shared-memory copy of t, described in b.
  Tensor stage(const Tensor& t, NetBuf* b) {
    if (!arena) arena = std::make_unique<shm::ShmArena>("r" + std::to_string(rank));
    auto blk = arena->allocate(t.nbytes());
    if (t.nbytes()) std::memcpy(blk->ptr, t.data_ptr(), t.nbytes());
    b->segment = blk->ref.segment;
    b->offset = blk->ref.offset;
    void* ptr = blk->ptr;
    return Tensor::from_blob(ptr, t.shape(), t.dtype(), Device::cpu(), std::shared_ptr<void>(std::move(blk)));
  }

  /// A view of a peer's buffer (mapped shared memory or the inline bytes).
  Tensor net_tensor(NetBuf& b) {
    if (!b.present) return Tensor();
    if (b.segment.empty()) {
      if (b.data.size() != b.bytes) throw StateError("rank", "inline buffer of the wrong size", rank);
      auto bytes = std::make_shared<std::vector<char>>(std::move(b.data));
      void* p = bytes->data();
      return Tensor::from_blob(p, b.shape, b.dtype, Device::cpu(), std::shared_ptr<void>(std::move(bytes)));
    }
    std::shared_ptr<void> keep;
    void* p = maps.resolve(shm::BlockRef{b.segment, b.offset, b.bytes}, &keep);
    return Tensor::from_blob(p, b.shape, b.dtype, Device::cpu(), std::move(keep));
  }

  void on_net_arrive(NetArrival& na) {
    CollKey key{na.gid, na.seq};
    if (failed.count(key) || broken.count(na.gid)) return;
    auto a = std::make_shared<Arrival>();
    a->gid = na.gid;
    a->seq = na.seq;
    a->from = na.from;
    a->members = std::make_shared<const std::vector<int>>(std::move(na.members));
    a->desc = std::move(na.desc);
    try {
      for (auto& b : na.bufs) a->tensors.push_back(net_tensor(b));
    } catch (const std::exception& e) {
      a->tensors.clear();
      a->unreadable = std::string("cannot read the buffers of group rank ") + std::to_string(na.from) + ": " + e.what();
    }
    on_arrive(a);
  }

  void on_arrive(const ArrivalPtr& a) {
    CollKey key{a->gid, a->seq};
    if (failed.count(key) || broken.count(a->gid)) return;
    auto& st = colls[key];
    if (!st.members) {
      st.members = a->members;
      st.arrivals.resize(a->members->size());
    }
    if (a->from < 0 || a->from >= static_cast<int>(st.arrivals.size()) ||
        st.arrivals[static_cast<std::size_t>(a->from)])
      return;  // malformed or duplicate: ignore
    st.arrivals[static_cast<std::size_t>(a->from)] = a;
    ++st.n_arrived;
    progress(key);
  }

  void on_done(std::uint64_t gid, std::uint64_t seq) {
    auto it = colls.find({gid, seq});
    if (it == colls.end()) return;  // failed or aborted here already
    ++it->second.n_done;
    progress(it->first);
  }

  void progress(CollKey key) {
    auto it = colls.find(key);
    if (it == colls.end()) return;
    auto& st = it->second;
    if (!st.local) return;
    const int n = static_cast<int>(st.members->size());
    if (st.n_arrived < n) return;
    const auto& op = st.local;
    const char* name_ = coll_name(op->desc.kind);
    for (const auto& a : st.arrivals)
      if (!a->unreadable.empty()) return;  // wait for its sender's death or the timeout
    if (!st.computed) {
      const auto& ref = st.arrivals[0]->desc;
      for (int g = 1; g < n; ++g) {
        const auto& d = st.arrivals[static_cast<std::size_t>(g)]->desc;
        if (!(d == ref)) {
          Failure f{FailKind::mismatch, name_,
                    "collective mismatch in " + group_str(key.first) + " at seq " + std::to_string(key.second) +
                        ": rank " + std::to_string(global_of(st, 0)) + " called " + ref.str() + " but rank " +
                        std::to_string(global_of(st, g)) + " called " + d.str()};
          fail(op, f);
          colls.erase(it);
          failed.insert(key);
          return;
        }
      }
      if (st.ring) {
        st.computed = true;
        try {
          start_ring(key, st);
        } catch (...) {
          op->promise.set_exception(current_as_error(name_, rank));
          colls.erase(it);
          failed.insert(key);
        }
        return;  // on_ring_done completes it
      }
      try {
        compute(st);
      } catch (...) {
        op->promise.set_exception(current_as_error(name_, rank));
        // Peers still wait for our done; send it so they do not time out (our
        // part of the output is unspecified).
      }
      st.computed = true;
      if (needs_done_phase(op->desc.kind) && !st.small) {
        ++st.n_done;
        for (int g = 0; g < n; ++g) {
          int peer = global_of(st, g);
          if (peer != rank) self->send(peers[static_cast<std::size_t>(peer)], done_atom::value, key.first, key.second);
        }
      } else {
        st.n_done = n;
      }
    }
    if (st.n_done < n) return;
    if (st.staged) copy_out(st);
    if (st.staged && op->desc.kind == CollKind::all_reduce && n > 1) {
      // Peers copy their results out of our staged copy (and we out of
      // theirs): it is reused only once each of them said so.
      auto& h = held[key];
      h.staging = st.arrivals[static_cast<std::size_t>(op->my_grank)]->tensors[0];
      h.expected = n - 1;
      for (int g = 0; g < n; ++g) {
        const int peer = global_of(st, g);
        if (peer != rank) self->send(peers[static_cast<std::size_t>(peer)], fetched_atom::value, key.first, key.second);
      }
      if (h.fetched >= h.expected) held.erase(key);
    }
    op->promise.set_value();
    colls.erase(it);
  }

  /// Tcp: runs the collective on the mesh; its completion comes back as a
  /// (ringdone, RingResult) message.
  void start_ring(CollKey key, CollState& st) {
    const Op& op = *st.local;
    RingGroup g;
    g.mesh = mesh.get();
    g.ranks = *st.members;
    g.me = op.my_grank;
    const std::uint64_t id = mesh_op_id(key.first, key.second);
    caf::actor me_ = me();
    auto scratch = std::make_shared<Tensor>();
    auto done = [me_, key, scratch](std::exception_ptr e) {
      auto r = std::make_shared<RingResult>();
      r->gid = key.first;
      r->seq = key.second;
      r->error = std::move(e);
      r->keep = scratch;
      caf::anon_send(me_, ringdone_atom::value, RingResultPtr(std::move(r)));
    };
    const Tensor& t0 = op.tensors[0];
    switch (op.desc.kind) {
      case CollKind::all_reduce:
        ring_all_reduce(g, id, t0.data_ptr(), t0.numel(), op.desc.dtype, op.desc.op, done);
        break;
      case CollKind::reduce: {
        // Every rank computes the reduction; only dst keeps it.
        void* buf = t0.data_ptr();
        if (op.my_grank != op.desc.root) {
          *scratch = t0.clone();
          buf = scratch->data_ptr();
        }
        ring_all_reduce(g, id, buf, t0.numel(), op.desc.dtype, op.desc.op, done);
        break;
      }
      case CollKind::broadcast:
        ring_broadcast(g, id, t0.data_ptr(), t0.nbytes(), op.desc.root, done);
        break;
      case CollKind::all_gather: {
        std::vector<void*> outs;
        for (std::size_t k = 1; k < op.tensors.size(); ++k) outs.push_back(op.tensors[k].data_ptr());
        ring_all_gather(g, id, t0.data_ptr(), t0.nbytes(), outs, done);
        break;
      }
      case CollKind::all_gather_flat:
        ring_all_gather(g, id, t0.data_ptr(), t0.nbytes(), op.tensors[1].data_ptr(), done);
        break;
      case CollKind::reduce_scatter: {
        std::vector<const void*> ins;
        std::vector<std::int64_t> counts;
        for (std::size_t k = 1; k < op.tensors.size(); ++k) {
          ins.push_back(op.tensors[k].data_ptr());
          counts.push_back(op.tensors[k].numel());
        }
        ring_reduce_scatter(g, id, ins, counts, t0.data_ptr(), op.desc.dtype, op.desc.op, done);
        break;
      }
      default:
        throw StateError(coll_name(op.desc.kind), "no ring algorithm for this collective", rank);
    }
  }

  void on_ring_done(const RingResult& r) {
    CollKey key{r.gid, r.seq};
    auto it = colls.find(key);
    if (it == colls.end() || !it->second.local) return;  // failed here already (timeout, lost peer)
    auto& st = it->second;
    if (!r.error) {
      st.local->promise.set_value();
    } else {
      // Name the first member we know to be lost (the cause), not merely the
      // connection that failed last (a survivor that exited after the loss).
      int cause = -1;
      for (int q : lost_order)
        if (q != rank && std::find(st.members->begin(), st.members->end(), q) != st.members->end()) {
          cause = q;
          break;
        }
      if (cause >= 0) fail(st.local, lost_failure_of(key, st, cause));
      else st.local->promise.set_exception(r.error);
    }
    colls.erase(it);
  }

  /// PeerLostError for call `key`, naming the first of its members that was
  /// lost (`peer` when none was before it).
  Failure lost_failure_of(CollKey key, const CollState& st, int peer) const {
    for (int q : lost_order) {
      if (q == rank || std::find(st.members->begin(), st.members->end(), q) == st.members->end()) continue;
      peer = q;
      break;
    }
    return Failure{FailKind::peer_lost, coll_name(st.local->desc.kind),
                   "rank " + std::to_string(peer) + " was lost during " + st.local->desc.str() + " in " +
                       group_str(key.first) + " (seq " + std::to_string(key.second) + "): " + lost.at(peer)};
  }

  void on_fetched(std::uint64_t gid, std::uint64_t seq) {
    auto& h = held[{gid, seq}];
    ++h.fetched;
    if (h.expected > 0 && h.fetched >= h.expected) held.erase({gid, seq});
  }

  /// Net: the results peers wrote into this rank's staged copy.
  void copy_out(const CollState& st) {
    const auto& op = *st.local;
    const int n = static_cast<int>(st.members->size());
    const int me = op.my_grank;
    if (op.desc.kind == CollKind::all_reduce) {
      // Every peer g wrote its share (elements [g*numel/n, (g+1)*numel/n)) into its staged copy.
      const std::int64_t numel = op.tensors[0].numel();
      const std::size_t es = itemsize(op.desc.dtype);
      for (int g = 0; g < n; ++g) {
        if (g == me) continue;
        const std::int64_t lo = numel * g / n, hi = numel * (g + 1) / n;
        if (hi > lo)
          std::memcpy(static_cast<char*>(op.tensors[0].data_ptr()) + lo * es,
                      static_cast<const char*>(st.arrivals[static_cast<std::size_t>(g)]->tensors[0].data_ptr()) + lo * es,
                      static_cast<std::size_t>(hi - lo) * es);
      }
    } else if (op.desc.kind == CollKind::reduce && me == op.desc.root) {
      const Tensor& staged = st.arrivals[static_cast<std::size_t>(me)]->tensors[0];
      if (op.tensors[0].nbytes()) std::memcpy(op.tensors[0].data_ptr(), staged.data_ptr(), op.tensors[0].nbytes());
    }
  }

  /// This rank's part of the work, on direct-access buffers (see process_group.hpp).
  void compute(const CollState& st) {
    const auto& op = *st.local;
    const int n = static_cast<int>(st.members->size());
    const int me = op.my_grank;
    auto arr = [&](int g) -> const Arrival& { return *st.arrivals[static_cast<std::size_t>(g)]; };
    auto copy = [](const Tensor& dst, std::size_t dst_off, const Tensor& src) {
      auto* d = static_cast<char*>(dst.data_ptr()) + dst_off;
      const void* s = src.data_ptr();
      if (d != s && src.nbytes()) std::memmove(d, s, src.nbytes());
    };
    switch (op.desc.kind) {
      case CollKind::all_reduce:
      case CollKind::reduce: {
        const std::int64_t numel = op.tensors[0].numel();
        std::int64_t lo = numel * me / n, hi = numel * (me + 1) / n;
        std::vector<const void*> ins;
        std::vector<void*> outs;
        for (int g = 0; g < n; ++g) ins.push_back(arr(g).tensors[0].data_ptr());
        if (st.small) {  // peers' inputs are private copies: compute all of our own result
          if (op.desc.kind == CollKind::reduce && me != op.desc.root) break;
          lo = 0;
          hi = numel;
          outs.push_back(op.tensors[0].data_ptr());
        } else if (op.desc.kind == CollKind::all_reduce && st.staged) {
          // Shared memory: our share goes into our own tensor and our staged
          // copy, where the peers fetch it once everybody is done (copy_out).
          outs.push_back(op.tensors[0].data_ptr());
          outs.push_back(arr(me).tensors[0].data_ptr());
        } else if (op.desc.kind == CollKind::all_reduce) {
          for (int g = 0; g < n; ++g) outs.push_back(arr(g).tensors[0].data_ptr());
        } else {
          outs.push_back(arr(op.desc.root).tensors[0].data_ptr());
        }
        reduce_range(op.desc.op, op.desc.dtype, ins, outs, lo, hi - lo);
        break;
      }
      case CollKind::broadcast:
        if (me != op.desc.root) copy(op.tensors[0], 0, arr(op.desc.root).tensors[0]);
        break;
      case CollKind::all_gather:
        for (int g = 0; g < n; ++g) copy(op.tensors[static_cast<std::size_t>(1 + g)], 0, arr(g).tensors[0]);
        break;
      case CollKind::all_gather_flat: {
        const std::size_t nb = op.tensors[0].nbytes();
        for (int g = 0; g < n; ++g) copy(op.tensors[1], nb * static_cast<std::size_t>(g), arr(g).tensors[0]);
        break;
      }
      case CollKind::reduce_scatter: {
        std::vector<const void*> ins;
        for (int g = 0; g < n; ++g) ins.push_back(arr(g).tensors[static_cast<std::size_t>(1 + me)].data_ptr());
        std::vector<void*> outs{op.tensors[0].data_ptr()};
        reduce_range(op.desc.op, op.desc.dtype, ins, outs, 0, op.tensors[0].numel());
        break;
      }
      default:
        break;
    }
  }

  std::vector<int> missing(const CollState& st) const {
    std::vector<int> out;
    for (std::size_t g = 0; g < st.arrivals.size(); ++g)
      if (!st.arrivals[g]) out.push_back((*st.members)[g]);
    return out;
  }

  void break_group(std::uint64_t gid, const Failure& why) {
    broken.emplace(gid, why);
    for (auto it = colls.begin(); it != colls.end();) {
      if (it->first.first == gid) {
        if (it->second.local) {
          Failure f = why;
          f.op = coll_name(it->second.local->desc.kind);
          fail(it->second.local, f);
        }
        it = colls.erase(it);
      } else {
        ++it;
      }
    }
  }

  void on_timeout(std::uint64_t gid, std::uint64_t seq) {
    auto it = colls.find({gid, seq});
    if (it == colls.end() || !it->second.local) return;
    auto& st = it->second;
    auto& op = *st.local;
    std::string who;
    auto miss = missing(st);
    if (!miss.empty()) {
      who = "rank(s)";
      for (int r : miss) who += " " + std::to_string(r);
      who += " did not join";
    } else {
      who = "peers did not finish";
      for (const auto& a : st.arrivals)
        if (!a->unreadable.empty()) who = a->unreadable;
    }
    std::string msg = "timed out after " + std::to_string(op.timeout.count()) + " ms in " + op.desc.str() +
                      " (" + group_str(gid) + ", seq " + std::to_string(seq) + "): " + who;
    Failure f{FailKind::timeout, coll_name(op.desc.kind), msg};
    auto members = st.members;
    if (st.ring && mesh)  // a stuck peer: end the ring (its buffers are released once it fails)
      for (int peer : *members)
        if (peer != rank && !mesh->peer_lost(peer)) mesh->fail_peer(peer, msg);
    fail(st.local, f);
    colls.erase(it);
    Failure later{FailKind::timeout, "", group_str(gid) + " is unusable after a timeout on rank " +
                                             std::to_string(rank) + ": " + msg};
    break_group(gid, later);
    for (int peer : *members)
      if (peer != rank) self->send(peers[static_cast<std::size_t>(peer)], abort_atom::value, gid, rank, later.msg);
  }

  void on_abort(std::uint64_t gid, int /*from*/, const std::string& msg) {
    if (broken.count(gid)) return;
    break_group(gid, Failure{FailKind::timeout, "", msg});
  }

  // --- failures of peers ---------------------------------------------------------

  /// A peer is lost. actor_dead: its actor is gone too (it will finish
  /// nothing). gone: its process is gone (seen here or by another rank), so
  /// the TCP connection to it is cut and ring collectives with it fail.
  /// pass_on: tell the other ranks (net), so that each names this peer even
  /// if it would first see a survivor exit.
  void on_lost(int peer, const std::string& what, bool actor_dead, bool gone = false, bool pass_on = false) {
    if (peer == rank) return;
    const bool first = lost.emplace(peer, what).second;
    if (first) lost_order.push_back(peer);
    if (actor_dead) dead.insert(peer);
    if (gone && mesh && !mesh->peer_lost(peer))
      mesh->fail_peer(peer, "rank " + std::to_string(peer) + " is lost: " + what);
    if (pass_on && first && plane != Plane::in_process)
      for (int k = 0; k < world; ++k)
        if (k != rank && k != peer && !dead.count(k))
          self->send(peers[static_cast<std::size_t>(k)], gone_atom::value, peer, what);
    for (auto it = colls.begin(); it != colls.end();) {
      auto& st = it->second;
      bool fails = false;
      if (st.local && st.members) {
        auto& m = *st.members;
        auto pos = std::find(m.begin(), m.end(), peer);
        if (pos != m.end()) {
          auto g = static_cast<std::size_t>(pos - m.begin());
          // A peer that joined still does its share, unless its actor is dead
          // and a share was left to do (kinds without a done phase, and
          // small net calls, need nothing more of it once it arrived; a ring
          // collective ends by itself, with an error if bytes are missing).
          const bool owes_work = needs_done_phase(st.local->desc.kind) && !st.small && !st.ring;
          fails = !st.arrivals[g] || (actor_dead && (owes_work || !st.arrivals[g]->unreadable.empty()));
        }
      }
      if (fails) {
        fail(st.local, lost_failure_of(it->first, st, peer));
        failed.insert(it->first);
        it = colls.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = recvs.begin(); it != recvs.end();) {
      if (it->first.src == peer) {
        fail(it->second, Failure{FailKind::peer_lost, "recv",
                                 "rank " + std::to_string(peer) + " was lost before sending: " + what});
        it = recvs.erase(it);
      } else {
        ++it;
      }
    }
    if (actor_dead) {
      for (auto it = sends.begin(); it != sends.end();) {
        if (it->first.dst == peer) {
          fail(it->second, Failure{FailKind::peer_lost, "send",
                                   "rank " + std::to_string(peer) + " was lost before receiving: " + what});
          it = sends.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  /// Net: heartbeat every peer_timeout / 4; a peer silent for peer_timeout is lost.
  void on_heartbeat_tick() {
    const auto now = std::chrono::steady_clock::now();
    for (int r = 0; r < world; ++r) {
      if (r == rank || dead.count(r)) continue;
      self->send(peers[static_cast<std::size_t>(r)], hb_atom::value, rank);
      if (now - last_heard[static_cast<std::size_t>(r)] > peer_timeout) {
        const std::string what = "no word from its process for " + std::to_string(peer_timeout.count()) +
                                 " ms (stopped, hung or cut off)";
        on_lost(r, what, true, true, true);
      }
    }
    self->delayed_send(self, peer_timeout / 4, hbtick_atom::value);
  }

  void on_self_failed(const std::string& what) {
    if (self_failed) return;
    self_failed = true;
    self_failed_what = what;
    for (int peer = 0; peer < world; ++peer)
      if (peer != rank) self->send(peers[static_cast<std::size_t>(peer)], lost_atom::value, rank, what);
    for (auto& [key, a] : unmatched) reply_lost(a->key);
    unmatched.clear();
  }

  // --- point to point --------------------------------------------------------------

  Failure lost_failure(const char* op) const {
    return Failure{FailKind::peer_lost, op,
                   "rank " + std::to_string(rank) + " failed before receiving: " + self_failed_what};
  }

  void reply_lost(const P2PKey& key) {
    P2PReply r{key, true, lost_failure("send")};
    self->send(peers[static_cast<std::size_t>(key.src)], p2pdone_atom::value, r);
  }

  void on_send(OpPtr op) {
    P2PKey key{op->gid, rank, op->peer, op->tag, op->seq};
    if (dead.count(op->peer)) {
      return fail(op, Failure{FailKind::peer_lost, "send",
                              "rank " + std::to_string(op->peer) + " was lost: " + lost[op->peer]});
    }
    if (plane != Plane::in_process) {
      NetP2P np;
      np.key = key;
      np.desc = op->desc;
      const Tensor& t = op->tensors[0];
      np.buf.present = true;
      np.buf.dtype = t.dtype();
      np.buf.shape = t.shape();
      np.buf.bytes = t.nbytes();
      try {
        if (static_cast<std::int64_t>(t.nbytes()) <= kSmallBytes) {
          const char* p = static_cast<const char*>(t.data_ptr());
          np.buf.data.assign(p, p + t.nbytes());
        } else if (plane == Plane::tcp) {
          np.buf.segment = kTcpSegment;  // the bytes follow on the mesh
          send_hold[key] = t;
          mesh->send(op->peer, p2p_tag(key), t.data_ptr(), t.nbytes(), [](std::exception_ptr) {});
        } else {
          send_hold[key] = stage(t, &np.buf);
        }
      } catch (...) {
        op->promise.set_exception(current_as_error("send", rank));
        return;
      }
      sends.emplace(key, op);
      self->send(peers[static_cast<std::size_t>(op->peer)], p2p_atom::value, std::move(np));
    } else {
      auto a = std::make_shared<P2PArrival>();
      a->key = key;
      a->desc = op->desc;
      a->tensor = op->tensors[0];
      sends.emplace(key, op);
      self->send(peers[static_cast<std::size_t>(op->peer)], p2p_atom::value, P2PArrivalPtr(a));
    }
    self->delayed_send(me(), op->timeout, p2ptmo_atom::value, key, true);
  }

  void on_recv(OpPtr op) {
    P2PKey key{op->gid, op->peer, rank, op->tag, op->seq};
    if (auto it = unmatched.find(key); it != unmatched.end()) {
      auto a = it->second;
      unmatched.erase(it);
      return match(op, a);
    }
    if (lost.count(op->peer)) {
      return fail(op, Failure{FailKind::peer_lost, "recv",
                              "rank " + std::to_string(op->peer) + " was lost before sending: " + lost[op->peer]});
    }
    recvs.emplace(key, op);
    self->delayed_send(me(), op->timeout, p2ptmo_atom::value, key, false);
  }

  static constexpr const char* kTcpSegment = "tcp:";

  static transport::Tag p2p_tag(const P2PKey& k) {
    return transport::Tag{(std::uint64_t{1} << 63) | mesh_op_id(k.gid, k.seq),
                          (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.src)) << 32) ^
                              (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.dst)) << 16) ^
                              static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.tag))};
  }

  std::map<P2PKey, OpPtr> tcp_recvs;  // tcp: recvs whose bytes are on the way

  /// Tcp: the bytes of a matched send arrived (error: "" when fine).
  void on_p2p_received(const P2PKey& key, const std::string& error) {
    auto it = tcp_recvs.find(key);
    if (it == tcp_recvs.end()) return;
    auto op = it->second;
    tcp_recvs.erase(it);
    P2PReply reply{key, false, Failure{}};
    if (!error.empty()) {
      fail(op, Failure{FailKind::peer_lost, "recv", error});
      reply.failed = true;
      reply.failure = Failure{FailKind::peer_lost, "send", error};
    } else {
      op->promise.set_value();
    }
    self->send(peers[static_cast<std::size_t>(key.src)], p2pdone_atom::value, reply);
  }

  void on_net_p2p(NetP2P& np) {
    auto a = std::make_shared<P2PArrival>();
    a->key = np.key;
    a->desc = np.desc;
    a->over_mesh = np.buf.segment == kTcpSegment;
    try {
      if (!a->over_mesh) a->tensor = net_tensor(np.buf);
    } catch (const std::exception& e) {
      P2PReply reply{np.key, true,
                     Failure{FailKind::state, "send", std::string("the receiver cannot read the buffer: ") + e.what()}};
      self->send(peers[static_cast<std::size_t>(np.key.src)], p2pdone_atom::value, reply);
      return;
    }
    on_p2p(a);
  }

  void on_p2p(const P2PArrivalPtr& a) {
    if (auto it = recvs.find(a->key); it != recvs.end()) {
      auto op = it->second;
      recvs.erase(it);
      return match(op, a);
    }
    if (self_failed) return reply_lost(a->key);
    unmatched.emplace(a->key, a);
  }

  void match(const OpPtr& op, const P2PArrivalPtr& a) {
    P2PReply reply{a->key, false, Failure{}};
    const Tensor& dst = op->tensors[0];
    if (a->desc.dtype != op->desc.dtype || a->desc.shape != op->desc.shape) {
      std::string msg = "rank " + std::to_string(a->key.src) + " sent " + std::string(dtype_name(a->desc.dtype)) +
                        " " + shape_str(a->desc.shape) + " (tag " + std::to_string(a->key.tag) + ") but rank " +
                        std::to_string(rank) + " receives into " + std::string(dtype_name(op->desc.dtype)) + " " +
                        shape_str(op->desc.shape);
      fail(op, Failure{FailKind::mismatch, "recv", msg});
      reply.failed = true;
      reply.failure = Failure{FailKind::mismatch, "send", msg};
    } else if (a->over_mesh) {
      tcp_recvs.emplace(a->key, op);
      caf::actor me_ = me();
      const P2PKey key = a->key;
      mesh->recv(key.src, p2p_tag(key), dst.data_ptr(), dst.nbytes(), [me_, key](std::exception_ptr e) {
        std::string why;
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            why = x.what();
          }
        }
        caf::anon_send(me_, p2precv_atom::value, key, why);
      });
      return;  // replied by on_p2p_received
    } else {
      if (dst.nbytes() && dst.data_ptr() != a->tensor.data_ptr())
        std::memmove(dst.data_ptr(), a->tensor.data_ptr(), dst.nbytes());
      op->promise.set_value();
    }
    self->send(peers[static_cast<std::size_t>(a->key.src)], p2pdone_atom::value, reply);
  }

  void on_p2p_done(const P2PReply& r) {
    auto it = sends.find(r.key);
    if (it == sends.end()) return;
    auto op = it->second;
    sends.erase(it);
    send_hold.erase(r.key);
    if (r.failed) fail(op, r.failure);
    else op->promise.set_value();
  }

  void on_p2p_timeout(const P2PKey& key, bool is_send) {
    auto& table = is_send ? sends : recvs;
    auto it = table.find(key);
    if (it == table.end()) return;
    auto op = it->second;
    table.erase(it);
    std::string msg = "timed out after " + std::to_string(op->timeout.count()) + " ms: rank " +
                      std::to_string(is_send ? key.dst : key.src) + " did not " +
                      (is_send ? "receive" : "send") + " (tag " + std::to_string(key.tag) + ")";
    fail(op, Failure{FailKind::timeout, is_send ? "send" : "recv", msg});
    if (is_send) {
      send_hold.erase(key);
      self->send(peers[static_cast<std::size_t>(key.dst)], p2pcncl_atom::value, key);
    }
  }

  void on_p2p_cancel(const P2PKey& key) { unmatched.erase(key); }
};

const char* RankState::name = "dopt.rank";

caf::behavior rank_actor(caf::stateful_actor<RankState>* self, int rank, int world) {
  auto& s = self->state;
  s.self = self;
  s.rank = rank;
  s.world = world;
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (int r = 0; r < st.world; ++r) {
      if (r == st.rank || st.peers[static_cast<std::size_t>(r)].address() != dm.source) continue;
      const bool cut = dm.reason == caf::exit_reason::remote_link_unreachable;
      const std::string what =
          cut ? std::string("the connection to its process was lost (the process died or the network failed)")
              : "its rank actor exited (" + to_string(dm.reason) + ")";
      st.on_lost(r, what, true, cut, cut);
    }
  });
  return {
      [self](init_atom, const PeersPtr& p) {
        auto& st = self->state;
        st.peers = p->actors;
        for (int r = 0; r < st.world; ++r)
          if (r != st.rank) self->monitor(st.peers[static_cast<std::size_t>(r)]);
      },
      [self](initnet_atom, const PeersPtr& p, std::int64_t peer_timeout_ms,
             const std::shared_ptr<transport::TcpMesh>& mesh) {
        // Real processes: peers are remote handles; buffers go through shared
        // memory, or over the TCP mesh when there is one.
        auto& st = self->state;
        st.peers = p->actors;
        st.plane = mesh ? Plane::tcp : Plane::shm;
        st.mesh = mesh;
        for (int r = 0; r < st.world; ++r)
          if (r != st.rank) self->monitor(st.peers[static_cast<std::size_t>(r)]);
        st.peer_timeout = std::chrono::milliseconds(peer_timeout_ms);
        st.last_heard.assign(static_cast<std::size_t>(st.world), std::chrono::steady_clock::now());
        self->delayed_send(self, st.peer_timeout / 4, hbtick_atom::value);
        return true;
      },
      [self](hb_atom, int from) {
        auto& st = self->state;
        if (from >= 0 && from < static_cast<int>(st.last_heard.size()))
          st.last_heard[static_cast<std::size_t>(from)] = std::chrono::steady_clock::now();
      },
      [self](hbtick_atom) { self->state.on_heartbeat_tick(); },
      [self](ringdone_atom, const RingResultPtr& r) { self->state.on_ring_done(*r); },

      [self](p2precv_atom, const P2PKey& k, const std::string& error) { self->state.on_p2p_received(k, error); },
      [self](arrive_atom, NetArrival& a) { self->state.on_net_arrive(a); },
      [self](p2p_atom, NetP2P& a) { self->state.on_net_p2p(a); },
      [self](call_atom, const OpPtr& op) { self->state.on_call(op); },
      [self](arrive_atom, const ArrivalPtr& a) { self->state.on_arrive(a); },
      [self](done_atom, std::uint64_t gid, std::uint64_t seq) { self->state.on_done(gid, seq); },
      [self](fetched_atom, std::uint64_t gid, std::uint64_t seq) { self->state.on_fetched(gid, seq); },
      [self](tmo_atom, std::uint64_t gid, std::uint64_t seq) { self->state.on_timeout(gid, seq); },
      [self](abort_atom, std::uint64_t gid, int from, const std::string& msg) {
        self->state.on_abort(gid, from, msg);
      },
      [self](lost_atom, int peer, const std::string& what) { self->state.on_lost(peer, what, false); },
      [self](gone_atom, int peer, const std::string& what) {
        // Only calls the peer never joined fail now: its messages for calls
        // it did join (a done, say) may still be on their way on our own
        // connection, and our own down_msg comes after them.
        auto& st = self->state;
        if (!st.dead.count(peer)) st.on_lost(peer, what + ", seen by a peer", false, true);
      },
      [self](failed_atom, const std::string& what) { self->state.on_self_failed(what); },
      [self](p2p_atom, const P2PArrivalPtr& a) { self->state.on_p2p(a); },
      [self](p2pdone_atom, const P2PReply& r) { self->state.on_p2p_done(r); },
      [self](p2ptmo_atom, const P2PKey& k, bool is_send) { self->state.on_p2p_timeout(k, is_send); },
      [self](p2pcncl_atom, const P2PKey& k) { self->state.on_p2p_cancel(k); },
  };
}

}  // namespace

// --- Runtime ------------------------------------------------------------------------

class LocalEndpoint;

class RuntimeImpl {
 public:
  explicit RuntimeImpl(RuntimeOptions opts) : options_(std::move(opts)) {
    options_.validate();
    threads_ = options_.threads > 0 ? options_.threads : hardware_threads();
    cfg_.set("scheduler.max-threads", threads_);
    cfg_.set("scheduler.policy", caf::atom_from_string(options_.policy));
    cfg_.set("work-stealing.moderate-poll-attempts", options_.moderate_poll_attempts);
    cfg_.load<caf::io::middleman>();  // rendezvous of real processes (rendezvous.cpp)
    // Control messages between the rank actors of real processes.
    cfg_.add_message_type<P2PKey>("dopt.P2PKey");
    cfg_.add_message_type<P2PReply>("dopt.P2PReply");
    cfg_.add_message_type<NetArrival>("dopt.NetArrival");
    cfg_.add_message_type<NetP2P>("dopt.NetP2P");
    UserThreadCafScope caf_scope;  // the thread that makes the runtime need not be the one that ends it
    system_ = std::make_unique<caf::actor_system>(cfg_);
  }
  ~RuntimeImpl() { shutdown(); }

  void shutdown() noexcept;
  bool running() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return system_ != nullptr;
  }

  caf::actor_system& system(const char* op) {
    if (!system_) throw StateError(op, "the runtime has been shut down");
    return *system_;
  }

  void add_endpoint(const std::shared_ptr<LocalEndpoint>& ep) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(endpoints_, [](auto& w) { return w.expired(); });
    endpoints_.push_back(ep);
  }

  void add_stopper(std::function<void()> stop) {
    std::lock_guard<std::mutex> lock(mutex_);
    stoppers_.push_back(std::move(stop));
  }

  RuntimeOptions options_;
  int threads_ = 1;

 private:
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<LocalEndpoint>> endpoints_;
  std::vector<std::function<void()>> stoppers_;
};

class LocalEndpoint final : public RankEndpoint {
 public:
  LocalEndpoint(caf::actor a, int rank, int world, std::chrono::milliseconds timeout)
      : actor_(std::move(a)), rank_(rank), world_(world), timeout_(timeout) {}
  ~LocalEndpoint() override { stop(); }

  void post(std::shared_ptr<Op> op) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!actor_) {
      op->promise.set_exception(std::make_exception_ptr(
          StateError(coll_name(op->desc.kind), "the runtime has been shut down", rank_)));
      return;
    }
    caf::anon_send(actor_, call_atom::value, OpPtr(std::move(op)));
  }
  void report_failure(std::string what) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (actor_) caf::anon_send(actor_, failed_atom::value, std::move(what));
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  /// Makes the rank actor exit (its pending operations fail) and drops the handle.
  void stop() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (actor_) {
      caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
      actor_ = nullptr;
    }
  }

  std::chrono::milliseconds default_timeout() const { return timeout_; }

 private:
  std::mutex mutex_;
  caf::actor actor_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
};

void RuntimeImpl::shutdown() noexcept {
  std::vector<std::weak_ptr<LocalEndpoint>> eps;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<std::function<void()>> stoppers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    eps.swap(endpoints_);
    stoppers.swap(stoppers_);
    sys = std::move(system_);
  }
  for (auto& w : eps)
    if (auto ep = w.lock()) ep->stop();
  for (auto& f : stoppers) f();
  sys.reset();  // joins CAF's threads once every actor has exited
}

caf::actor_system& runtime_system(RuntimeImpl& rt, const char* op) { return rt.system(op); }
void runtime_add_stopper(RuntimeImpl& rt, std::function<void()> stop) { rt.add_stopper(std::move(stop)); }

std::vector<std::shared_ptr<RankEndpoint>> spawn_rank_actors(caf::actor_system& sys, int world_size,
                                                              std::chrono::milliseconds timeout,
                                                              std::vector<caf::actor>* actors) {
  UserThreadCafScope caf_scope;
  auto peers = std::make_shared<Peers>();
  for (int r = 0; r < world_size; ++r) peers->actors.push_back(sys.spawn(rank_actor, r, world_size));
  PeersPtr pp = peers;
  std::vector<std::shared_ptr<RankEndpoint>> out;
  for (int r = 0; r < world_size; ++r) {
    auto& a = peers->actors[static_cast<std::size_t>(r)];
    caf::anon_send(a, init_atom::value, pp);
    out.push_back(std::make_shared<LocalEndpoint>(a, r, world_size, timeout));
  }
  if (actors) *actors = peers->actors;
  return out;
}

std::vector<std::shared_ptr<RankEndpoint>> spawn_local_world(RuntimeImpl& rt, int world_size) {
  auto out = spawn_rank_actors(rt.system("simulate"), world_size, rt.options_.collective_timeout, nullptr);
  for (auto& ep : out) rt.add_endpoint(std::static_pointer_cast<LocalEndpoint>(ep));
  return out;
}

namespace {

/// "host=<hostname> boot=<boot id>": ranks with equal infos share a kernel,
/// hence /dev/shm.
std::string host_info() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) boot = buf;
    std::fclose(f);
    while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  }
  return std::string("host=") + host + " boot=" + boot;
}

}  // namespace

ProcessGroup init_world_group(Runtime& runtime, const LaunchEnv& env, const InitOptions& options) {
  UserThreadCafScope caf_scope;
  const char* op = "init_process_group";
  std::string plane_choice = options.transport;
  if (const char* t = std::getenv("DOPT_TRANSPORT"); t && *t) plane_choice = t;
  if (plane_choice != "auto" && plane_choice != "shm" && plane_choice != "tcp")
    throw ValueError(op, "transport must be 'auto', 'shm' or 'tcp', got '" + plane_choice + "'", env.rank);
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size)
    throw ValueError(op, "rank " + std::to_string(env.rank) + " is outside [0, " + std::to_string(env.world_size) + ")",
                     env.rank);
  auto& rt = runtime.impl();
  auto& sys = rt.system(op);
  if (env.local_rank == 0) shm::remove_stale_segments();
  caf::actor a = sys.spawn(rank_actor, env.rank, env.world_size);
  auto ep = std::make_shared<LocalEndpoint>(a, env.rank, env.world_size, rt.options_.collective_timeout);
  rt.add_endpoint(ep);
  // Every rank actor listens on a port of its own, so that every pair of
  // ranks gets a direct connection: a peer's death is then seen by all
  // (BASP would otherwise route through rank 0, and lose sight of the dead
  // peer when rank 0 goes). The TCP data plane listens too. Both ports are
  // opened inside the rendezvous, once rank 0 holds MASTER_PORT.
  const std::string host = host_info();
  std::optional<transport::TcpListener> listener;
  auto make_info = [&] {
    // Ports behind dopt's handshake (job id, secret), on the chosen interface.
    std::string info = host + publish_control_port(rt, sys, a, env, op);
    if (plane_choice != "shm") listener.emplace(transport::TcpMesh::listen(info_field(info, "bind")));
    return info + " tcp=" + std::to_string(listener ? listener->port() : 0);
  };
  RendezvousResult rdv = rendezvous_with(runtime, env, options.timeout, a, make_info);
  const auto& infos = rendezvous_infos(rdv);
  std::vector<int> elsewhere;
  auto field = [](const std::string& text, const std::string& key) {
    auto p = text.find(" " + key + "=");
    if (p == std::string::npos) return std::string();
    p += key.size() + 2;
    return text.substr(p, text.find(' ', p) - p);
  };
  for (int r = 0; r < env.world_size; ++r)
    if (infos[static_cast<std::size_t>(r)].rfind(host + " ", 0) != 0) elsewhere.push_back(r);
  const bool use_tcp = plane_choice == "tcp" || !elsewhere.empty();
  if (use_tcp && plane_choice == "shm") {
    std::string who;
    for (int r : elsewhere) who += (who.empty() ? "" : ", ") + std::to_string(r);
    throw ValueError(op, "transport 'shm' needs every rank on this host, but ranks " + who + " are on another host",
                     env.rank);
  }
  for (int r = 0; use_tcp && r < env.world_size; ++r)
    if (field(infos[static_cast<std::size_t>(r)], "tcp") == "0")
      throw ValueError(op, "rank " + std::to_string(r) + " has no TCP data plane (DOPT_TRANSPORT=shm there?) but " +
                               "this world needs one; set the same DOPT_TRANSPORT on every rank", env.rank);
  auto peers = std::make_shared<Peers>();
  peers->actors = rendezvous_payloads(rdv);
  peers->actors[static_cast<std::size_t>(env.rank)] = a;
  // Direct connections: rank i (> 0) connects to every rank above it; rank 0
  // has one to everybody from the rendezvous. Each is bounded by the
  // handshake timeout; a rank that fails tells the others (setup_step), so
  // every rank stops at the barrier below naming it.
  setup_step(rdv, env.rank, op, [&] {
    for (int r = std::max(1, env.rank + 1); env.rank > 0 && r < env.world_size; ++r)
      peers->actors[static_cast<std::size_t>(r)] =
          connect_control_port(sys, env, r, host, infos[static_cast<std::size_t>(r)], op);
  });
  rdv.barrier(options.timeout);
  std::shared_ptr<transport::TcpMesh> mesh;
  if (use_tcp) {
    std::vector<std::string> endpoints;
    for (int r = 0; r < env.world_size; ++r) endpoints.push_back(data_endpoint(host, infos[static_cast<std::size_t>(r)]));
    // A connection of the mesh that ends is not taken as the peer's loss: a
    // peer that finished and exited closes it before its last control
    // messages (on CAF's connection) may have arrived. Collectives that still
    // need its bytes fail by themselves; the loss itself is CAF's down_msg.
    // Every rank is here now: connecting is bounded by the handshake timeout.
    transport::TcpMeshOptions mesh_options;
    mesh_options.credentials = net::Credentials::from(env);
    mesh = setup_step(rdv, env.rank, op, [&] {
      return std::make_shared<transport::TcpMesh>(env.rank, env.world_size, std::move(*listener), endpoints,
                                                  env.handshake_timeout, mesh_options);
    });
    // The rank actor owns it; the runtime closes it at shutdown (after the actor is gone).
    std::weak_ptr<transport::TcpMesh> weak = mesh;
    runtime_add_stopper(rt, [weak] {
      if (auto m = weak.lock()) m->close();
    });
  }
  {
    caf::scoped_actor self{sys};
    bool ok = false;
    self->request(a, caf::infinite, initnet_atom::value, PeersPtr(peers),
                  static_cast<std::int64_t>(rt.options_.peer_timeout.count()), mesh)
        .receive([&](bool) { ok = true; },
                 [&](caf::error& e) {
                   throw StateError(op, "the rank actor did not start: " + sys.render(e), env.rank);
                 });
    (void)ok;
  }
  // Nobody sends collective messages before every rank actor knows its peers.
  rdv.barrier(options.timeout);
  // The rank actors hold the peer handles now; the rendezvous actors can go
  // when rdv does.
  auto g = std::make_shared<GroupImpl>();
  g->endpoint = ep;
  g->gid = 0;
  auto members = std::make_shared<std::vector<int>>();
  for (int r = 0; r < env.world_size; ++r) members->push_back(r);
  g->members = std::move(members);
  g->my_grank = env.rank;
  g->is_world = true;
  g->local_world_size = env.local_world_size;
  g->timeout_ms.store(rt.options_.collective_timeout.count());
  return ProcessGroup(std::move(g));
}

}  // namespace dopt::detail

namespace dopt {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || errno != 0 || x <= 0 || x > 1'000'000'000)
    throw ValueError("RuntimeOptions.from_env",
                     std::string(name) + " must be a positive integer, got '" + v + "'");
  return static_cast<int>(x);
}
}  // namespace

RuntimeOptions RuntimeOptions::from_env() {
  RuntimeOptions o;
  o.threads = env_int("DOPT_THREADS", 0);
  if (const char* p = std::getenv("DOPT_SCHEDULER_POLICY"); p && *p) o.policy = p;
  o.collective_timeout = std::chrono::milliseconds(env_int("DOPT_TIMEOUT_MS", static_cast<int>(o.collective_timeout.count())));
  o.peer_timeout = std::chrono::milliseconds(env_int("DOPT_PEER_TIMEOUT_MS", static_cast<int>(o.peer_timeout.count())));
  o.validate();
  return o;
}

void RuntimeOptions::validate() const {
  if (threads < 0 || threads > 4096)
    throw ValueError("Runtime", "threads must be in [0, 4096], got " + std::to_string(threads));
  if (policy != "stealing" && policy != "sharing")
    throw ValueError("Runtime", "scheduler policy must be 'stealing' or 'sharing', got '" + policy + "'");
  if (moderate_poll_attempts < 0)
    throw ValueError("Runtime", "moderate_poll_attempts must be >= 0, got " + std::to_string(moderate_poll_attempts));
  if (peer_timeout.count() < 100)
    throw ValueError("Runtime", "peer_timeout must be at least 100 ms, got " + std::to_string(peer_timeout.count()) +
                                    " ms");
  if (collective_timeout.count() <= 0)
    throw ValueError("Runtime", "collective_timeout must be positive, got " +
                                    std::to_string(collective_timeout.count()) + " ms");
}

Runtime::Runtime(RuntimeOptions options) : impl_(std::make_unique<detail::RuntimeImpl>(std::move(options))) {}
Runtime::~Runtime() { shutdown(); }
void Runtime::shutdown() noexcept {
  if (impl_) impl_->shutdown();
}
bool Runtime::running() const noexcept { return impl_ && impl_->running(); }
const RuntimeOptions& Runtime::options() const noexcept { return impl_->options_; }
int Runtime::threads() const noexcept { return impl_->threads_; }
detail::RuntimeImpl& Runtime::impl() { return *impl_; }

}  // namespace dopt
