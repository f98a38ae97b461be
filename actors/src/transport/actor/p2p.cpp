// send/recv on the actor plane: the sender's actor sends the tensor (a
// handle between threads; the bytes, inline or on the TCP mesh, between
// processes); the receiver's actor matches it with a recv by (group, src,
// dst, tag, seq), copies, and replies. A send completes with the reply.
#include <cstring>

#include "transport/actor/rank_state.hpp"

namespace dopt::detail {

Failure RankState::lost_failure(const char* op) const {
  return Failure{FailKind::peer_lost, op,
                 "rank " + std::to_string(rank) + " failed before receiving: " + self_failed_what};
}

void RankState::reply_lost(const P2PKey& key) {
  P2PReply r{key, true, lost_failure("send")};
  self->send(actor_of(key.src), p2pdone_atom::value, r);
}

void RankState::on_send(OpPtr op) {
  P2PKey key{op->gid, rank, op->peer, op->tag, op->seq};
  watch(op->peer);
  if (dead.count(op->peer)) {
    return fail(op, Failure{FailKind::peer_lost, "send",
                            "rank " + std::to_string(op->peer) + " was lost: " + lost[op->peer]});
  }
  if (net) {
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
      } else {
        if (!mesh) throw no_mesh("send");
        np.buf.over_mesh = true;  // the bytes follow on the mesh
        send_hold[key] = t;
        mesh->send(op->peer, p2p_tag(key), t.data_ptr(), t.nbytes(), [](std::exception_ptr) {});
      }
    } catch (...) {
      op->promise.set_exception(current_as_error("send", rank));
      return;
    }
    sends.emplace(key, op);
    self->send(actor_of(op->peer), p2p_atom::value, std::move(np));
  } else {
    auto a = std::make_shared<P2PArrival>();
    a->key = key;
    a->desc = op->desc;
    a->tensor = op->tensors[0];
    sends.emplace(key, op);
    self->send(actor_of(op->peer), p2p_atom::value, P2PArrivalPtr(a));
  }
  self->delayed_send(me(), op->timeout, p2ptmo_atom::value, key, true);
}

void RankState::on_recv(OpPtr op) {
  P2PKey key{op->gid, op->peer, rank, op->tag, op->seq};
  watch(op->peer);
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

void RankState::on_net_p2p(NetP2P& np) {
  auto a = std::make_shared<P2PArrival>();
  a->key = np.key;
  a->desc = np.desc;
  a->over_mesh = np.buf.over_mesh;
  try {
    if (!a->over_mesh) a->tensor = net_tensor(np.buf);
  } catch (const std::exception& e) {
    P2PReply reply{np.key, true,
                   Failure{FailKind::state, "send", std::string("the receiver cannot read the buffer: ") + e.what()}};
    self->send(actor_of(np.key.src), p2pdone_atom::value, reply);
    return;
  }
  on_p2p(a);
}

void RankState::on_p2p(const P2PArrivalPtr& a) {
  if (auto it = recvs.find(a->key); it != recvs.end()) {
    auto op = it->second;
    recvs.erase(it);
    return match(op, a);
  }
  if (self_failed) return reply_lost(a->key);
  unmatched.emplace(a->key, a);
}

void RankState::match(const OpPtr& op, const P2PArrivalPtr& a) {
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
  self->send(actor_of(a->key.src), p2pdone_atom::value, reply);
}

void RankState::on_p2p_done(const P2PReply& r) {
  auto it = sends.find(r.key);
  if (it == sends.end()) return;
  auto op = it->second;
  sends.erase(it);
  send_hold.erase(r.key);
  if (r.failed) fail(op, r.failure);
  else op->promise.set_value();
}

void RankState::on_p2p_timeout(const P2PKey& key, bool is_send) {
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
    self->send(actor_of(key.dst), p2pcncl_atom::value, key);
  }
}

}  // namespace dopt::detail
