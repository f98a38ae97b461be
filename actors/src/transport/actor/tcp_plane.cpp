// The parts of the actor plane whose bytes go over the TCP mesh between
// hosts: large collectives as ring collectives (ring.hpp), large sends as
// mesh messages.
#include <algorithm>

#include "transport/actor/rank_state.hpp"
#include "dopt/actors/internal/ring.hpp"

namespace dopt::detail {

NotSupportedError RankState::no_mesh(const std::string& who) const {
  return NotSupportedError(who, "no TCP mesh for a buffer of more than " + std::to_string(kSmallBytes) +
                                    " bytes between processes (this world runs without one)", rank);
}

/// Tcp: runs the collective on the mesh; its completion comes back as a
/// (ringdone, RingResult) message.
void RankState::start_ring(CollKey key, CollState& st) {
  const Op& op = *st.local;
  RingGroup g;
  g.mesh = mesh.get();
  g.ranks = *st.members;
  g.me = op.my_grank;
  const std::uint64_t id = mesh_op_id(key.first, key.second);
  caf::actor me_ = me();
  // The ring reads (and writes) the call's tensors until it ends, which may
  // be after the call itself failed here (timeout, an abort): they stay
  // alive until then.
  auto done = [me_, key, keep = op.tensors](std::exception_ptr e) {
    auto r = std::make_shared<RingResult>();
    r->gid = key.first;
    r->seq = key.second;
    r->error = std::move(e);
    caf::anon_send(me_, ringdone_atom::value, RingResultPtr(std::move(r)));
  };
  const Tensor& t0 = op.tensors[0];
  RingOptions ro;
  ro.order = op.desc.order;
  ro.pre_divisor = op.desc.pre_divisor;
  switch (op.desc.kind) {
    case CollKind::all_reduce:
      ring_all_reduce(g, id, t0.data_ptr(), t0.numel(), op.desc.dtype, op.desc.op, done, ro);
      break;
    case CollKind::reduce:
      // Only dst receives; the other ranks' tensors are only read (no copy).
      ring_reduce(g, id, t0.data_ptr(), t0.numel(), op.desc.dtype, op.desc.op, op.desc.root, done, ro);
      break;
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
      throw StateError(op.desc.who(), "no ring algorithm for this collective", rank);
  }
}

void RankState::on_ring_done(const RingResult& r) {
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

transport::Tag RankState::p2p_tag(const P2PKey& k) {
  return transport::Tag{(std::uint64_t{1} << 63) | mesh_op_id(k.gid, k.seq),
                        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.src)) << 32) ^
                            (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.dst)) << 16) ^
                            static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.tag))};
}

/// Tcp: the bytes of a matched send arrived (error: "" when fine).
void RankState::on_p2p_received(const P2PKey& key, const std::string& error) {
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
  self->send(actor_of(key.src), p2pdone_atom::value, reply);
}

}  // namespace dopt::detail
