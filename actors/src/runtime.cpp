// The only translation unit of dopt_actors that includes CAF: the embedded
// actor system (Runtime) and the rank actor with its collective state
// machines. See docs/architecture.md for the protocol.
#include "dopt/actors/runtime.hpp"

#include <algorithm>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/parallel.hpp"
#include "internal.hpp"
#include "kernels.hpp"

namespace dopt::detail {

// --- messages between rank actors (local only: whitelisted, never serialised).
// For real multi-process ranks only the descriptors travel over CAF; tensors
// are replaced by data-plane buffer descriptors (see docs/architecture.md).

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
  std::optional<Failure> failure;
};

struct Peers {
  std::vector<caf::actor> actors;  // index: global rank
};
using PeersPtr = std::shared_ptr<const Peers>;
using OpPtr = std::shared_ptr<Op>;

}  // namespace dopt::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::ArrivalPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::P2PArrivalPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::P2PKey)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::P2PReply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::PeersPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::detail::OpPtr)

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

/// The data plane a rank actor moves bytes with. The collective state
/// machines only ask it whether peers' buffers are directly addressable; the
/// direct (in-process, later shared-memory) algorithms below then read and
/// write peers' tensors in place. A network data plane (Asio TCP) will add
/// post_send/post_recv of chunks with completions delivered as messages, and
/// ring algorithms that use them.
class DataPlane {
 public:
  virtual ~DataPlane() = default;
  virtual const char* name() const = 0;
  virtual bool direct_access() const = 0;
};

class InProcessDataPlane final : public DataPlane {
 public:
  const char* name() const override { return "in-process"; }
  bool direct_access() const override { return true; }
};

using CollKey = std::pair<std::uint64_t, std::uint64_t>;  // (gid, seq)

struct CollState {
  OpPtr local;
  std::shared_ptr<const std::vector<int>> members;
  std::vector<ArrivalPtr> arrivals;  // index: group rank
  int n_arrived = 0;
  int n_done = 0;
  bool computed = false;
};

bool needs_done_phase(CollKind k) { return k != CollKind::barrier && k != CollKind::new_group; }

struct RankState {
  caf::event_based_actor* self = nullptr;
  int rank = 0;
  int world = 0;
  std::vector<caf::actor> peers;
  std::unique_ptr<DataPlane> plane = std::make_unique<InProcessDataPlane>();

  std::map<CollKey, CollState> colls;
  std::set<CollKey> failed;                   // failed here; late messages are dropped
  std::map<std::uint64_t, Failure> broken;    // group -> why it is unusable
  std::map<int, std::string> lost;            // global rank -> why
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
    if (!plane->direct_access() && op->desc.has_tensor()) {
      fail(op, Failure{FailKind::state, name_, std::string("no algorithm for data plane ") + plane->name()});
      colls.erase(key);
      failed.insert(key);
      return;
    }
    auto a = std::make_shared<Arrival>();
    a->gid = op->gid;
    a->seq = op->seq;
    a->from = op->my_grank;
    a->members = op->members;
    a->desc = op->desc;
    a->tensors = op->tensors;
    ArrivalPtr ap = a;
    st.arrivals[static_cast<std::size_t>(op->my_grank)] = ap;
    ++st.n_arrived;
    for (int g = 0; g < n; ++g) {
      int peer = global_of(st, g);
      if (peer != rank) self->send(peers[static_cast<std::size_t>(peer)], arrive_atom::value, ap);
    }
    self->delayed_send(me(), op->timeout, tmo_atom::value, op->gid, op->seq);
    progress(key);
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
      try {
        compute(st);
      } catch (...) {
        op->promise.set_exception(current_as_error(name_, rank));
        // Peers still wait for our done; send it so they do not time out (our
        // part of the output is unspecified).
      }
      st.computed = true;
      if (needs_done_phase(op->desc.kind)) {
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
    op->promise.set_value();
    colls.erase(it);
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
        const std::int64_t lo = numel * me / n, hi = numel * (me + 1) / n;
        std::vector<const void*> ins;
        std::vector<void*> outs;
        for (int g = 0; g < n; ++g) ins.push_back(arr(g).tensors[0].data_ptr());
        if (op.desc.kind == CollKind::all_reduce) {
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
    }
    std::string msg = "timed out after " + std::to_string(op.timeout.count()) + " ms in " + op.desc.str() +
                      " (" + group_str(gid) + ", seq " + std::to_string(seq) + "): " + who;
    Failure f{FailKind::timeout, coll_name(op.desc.kind), msg};
    auto members = st.members;
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

  void on_lost(int peer, const std::string& what, bool actor_dead) {
    if (peer == rank) return;
    lost.emplace(peer, what);
    if (actor_dead) dead.insert(peer);
    for (auto it = colls.begin(); it != colls.end();) {
      auto& st = it->second;
      bool fails = false;
      if (st.local && st.members) {
        auto& m = *st.members;
        auto pos = std::find(m.begin(), m.end(), peer);
        if (pos != m.end()) {
          auto g = static_cast<std::size_t>(pos - m.begin());
          // Its actor still serves collectives it joined, unless it is dead.
          fails = !st.arrivals[g] || actor_dead;
        }
      }
      if (fails) {
        Failure f{FailKind::peer_lost, coll_name(st.local->desc.kind),
                  "rank " + std::to_string(peer) + " was lost during " + st.local->desc.str() + " in " +
                      group_str(it->first.first) + " (seq " + std::to_string(it->first.second) + "): " + what};
        fail(st.local, f);
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
    P2PReply r{key, lost_failure("send")};
    self->send(peers[static_cast<std::size_t>(key.src)], p2pdone_atom::value, r);
  }

  void on_send(OpPtr op) {
    P2PKey key{op->gid, rank, op->peer, op->tag, op->seq};
    if (dead.count(op->peer)) {
      return fail(op, Failure{FailKind::peer_lost, "send",
                              "rank " + std::to_string(op->peer) + " was lost: " + lost[op->peer]});
    }
    auto a = std::make_shared<P2PArrival>();
    a->key = key;
    a->desc = op->desc;
    a->tensor = op->tensors[0];
    sends.emplace(key, op);
    self->send(peers[static_cast<std::size_t>(op->peer)], p2p_atom::value, P2PArrivalPtr(a));
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
    P2PReply reply{a->key, std::nullopt};
    const Tensor& dst = op->tensors[0];
    if (a->desc.dtype != op->desc.dtype || a->desc.shape != op->desc.shape) {
      std::string msg = "rank " + std::to_string(a->key.src) + " sent " + std::string(dtype_name(a->desc.dtype)) +
                        " " + shape_str(a->desc.shape) + " (tag " + std::to_string(a->key.tag) + ") but rank " +
                        std::to_string(rank) + " receives into " + std::string(dtype_name(op->desc.dtype)) + " " +
                        shape_str(op->desc.shape);
      fail(op, Failure{FailKind::mismatch, "recv", msg});
      reply.failure = Failure{FailKind::mismatch, "send", msg};
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
    if (r.failure) fail(op, *r.failure);
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
    if (is_send) self->send(peers[static_cast<std::size_t>(key.dst)], p2pcncl_atom::value, key);
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
    for (int r = 0; r < st.world; ++r)
      if (r != st.rank && st.peers[static_cast<std::size_t>(r)].address() == dm.source)
        st.on_lost(r, "its rank actor exited (" + to_string(dm.reason) + ")", true);
  });
  return {
      [self](init_atom, const PeersPtr& p) {
        auto& st = self->state;
        st.peers = p->actors;
        for (int r = 0; r < st.world; ++r)
          if (r != st.rank) self->monitor(st.peers[static_cast<std::size_t>(r)]);
      },
      [self](call_atom, const OpPtr& op) { self->state.on_call(op); },
      [self](arrive_atom, const ArrivalPtr& a) { self->state.on_arrive(a); },
      [self](done_atom, std::uint64_t gid, std::uint64_t seq) { self->state.on_done(gid, seq); },
      [self](tmo_atom, std::uint64_t gid, std::uint64_t seq) { self->state.on_timeout(gid, seq); },
      [self](abort_atom, std::uint64_t gid, int from, const std::string& msg) {
        self->state.on_abort(gid, from, msg);
      },
      [self](lost_atom, int peer, const std::string& what) { self->state.on_lost(peer, what, false); },
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

std::vector<std::shared_ptr<RankEndpoint>> spawn_local_world(RuntimeImpl& rt, int world_size) {
  auto& sys = rt.system("simulate");
  auto peers = std::make_shared<Peers>();
  for (int r = 0; r < world_size; ++r) peers->actors.push_back(sys.spawn(rank_actor, r, world_size));
  PeersPtr pp = peers;
  std::vector<std::shared_ptr<RankEndpoint>> out;
  for (int r = 0; r < world_size; ++r) {
    auto& a = peers->actors[static_cast<std::size_t>(r)];
    caf::anon_send(a, init_atom::value, pp);
    auto ep = std::make_shared<LocalEndpoint>(a, r, world_size, rt.options_.collective_timeout);
    rt.add_endpoint(ep);
    out.push_back(ep);
  }
  return out;
}

ProcessGroup init_world_group(Runtime& /*runtime*/, const LaunchEnv& env, const InitOptions& /*options*/) {
  throw NotSupportedError("init_process_group", "real processes are not wired yet", env.rank);
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
