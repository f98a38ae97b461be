// The collective protocol of the actor plane: every member sends its arrival
// (what it called, and its buffers) to every other member; once all N are in
// and their descriptors agree, each computes its share and tells the others
// (done); a call completes when all N are done. See docs/architecture.md.
#include <algorithm>
#include <optional>

#include "dopt/actors/internal/call_label.hpp"
#include "transport/actor/rank_state.hpp"

namespace dopt::detail {

void RankState::on_call(OpPtr op) {
  if (op->desc.kind == CollKind::send) return on_send(std::move(op));
  if (op->desc.kind == CollKind::recv) return on_recv(std::move(op));
  const char* name_ = op->desc.who();
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
  for (int g = 0; g < n; ++g) watch(global_of(st, g));
  // A member that was lost before arriving will never arrive (messages from
  // one actor arrive in order, and its 'lost' came after its arrivals).
  // Between processes a small call's arrival may have reached another
  // member, though (the lost process sent it to some members only): it is
  // asked for once this rank's own arrival is out (relay.cpp).
  auto lost_before = [&](int peer) {
    fail(op, Failure{FailKind::peer_lost, name_,
                     "rank " + std::to_string(peer) + " was lost before it joined " + op->desc.str() + " in " +
                         group_str(op->gid) + " (seq " + std::to_string(op->seq) + "): " + lost[peer]});
    colls.erase(key);
    failed.insert(key);
  };
  std::vector<int> ask;
  for (int g = 0; g < n; ++g) {
    int peer = global_of(st, g);
    if (!st.arrivals[static_cast<std::size_t>(g)] && lost.count(peer) && peer != rank) {
      if (net && small_call(op->desc)) {
        ask.push_back(g);
        continue;
      }
      return lost_before(peer);
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
  if (net) {
    try {
      net_msg = make_net_arrival(st, *op);
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
    if (net_msg) self->send(actor_of(peer), *net_msg);
    else self->send(actor_of(peer), arrive_atom::value, ap);
  }
  self->delayed_send(me(), op->timeout, tmo_atom::value, op->gid, op->seq);
  for (int g : ask)
    if (!ask_for_arrival(key, st, g)) return lost_before(global_of(st, g));
  progress(key);
}

caf::message RankState::make_net_arrival(CollState& st, const Op& op) {
  NetArrival na;
  na.gid = op.gid;
  na.seq = op.seq;
  na.from = op.my_grank;
  na.members = *op.members;
  na.desc = op.desc;
  const bool small = small_call(op.desc);
  st.small = small;
  // Decided from the descriptor alone, so every rank takes the same path.
  st.ring = !small && op.desc.has_tensor();
  if (st.ring && !mesh)
    throw no_mesh(op.desc.who());
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
    } else {
      b.present = false;  // the bytes go round the ring, not with the arrival
    }
  }
  return caf::make_message(arrive_atom::value, std::move(na));
}

/// A view of a peer's inline bytes.
Tensor RankState::net_tensor(NetBuf& b) {
  if (!b.present) return Tensor();
  if (b.data.size() != b.bytes) throw StateError("rank", "inline buffer of the wrong size", rank);
  auto bytes = std::make_shared<std::vector<char>>(std::move(b.data));
  void* p = bytes->data();
  return Tensor::from_blob(p, b.shape, b.dtype, Device::cpu(), std::shared_ptr<void>(std::move(bytes)));
}

void RankState::on_net_arrive(NetArrival& na, bool relayed) {
  CollKey key{na.gid, na.seq};
  if (failed.count(key) || broken.count(na.gid)) return;
  if (!relayed && refused.count({na.gid, na.seq, na.from})) return;  // asked for, and answered no (relay.cpp)
  auto a = std::make_shared<Arrival>();
  a->gid = na.gid;
  a->seq = na.seq;
  a->from = na.from;
  a->members = std::make_shared<const std::vector<int>>(std::move(na.members));
  a->desc = std::move(na.desc);
  try {
    for (auto& b : na.bufs) a->tensors.push_back(net_tensor(b));
  } catch (const std::exception&) {
    return;  // malformed: as if it never came (the call times out naming the sender)
  }
  if (!deferred.empty()) answer_deferred(a->gid, a->seq, a->from, a);  // asked for while on its way (relay.cpp)
  on_arrive(a);
}

void RankState::on_arrive(const ArrivalPtr& a) {
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

void RankState::on_done(std::uint64_t gid, std::uint64_t seq) {
  auto it = colls.find({gid, seq});
  if (it == colls.end()) return;  // failed or aborted here already
  ++it->second.n_done;
  progress(it->first);
}

void RankState::progress(CollKey key) {
  auto it = colls.find(key);
  if (it == colls.end()) return;
  auto& st = it->second;
  if (!st.local) return;
  const int n = static_cast<int>(st.members->size());
  if (st.n_arrived < n) return;
  const auto& op = st.local;
  const char* name_ = op->desc.who();
  if (!st.computed) {
    const auto& ref = st.arrivals[0]->desc;
    for (int g = 1; g < n; ++g) {
      const auto& d = st.arrivals[static_cast<std::size_t>(g)]->desc;
      if (!(d == ref)) {
        std::vector<std::pair<int, std::string>> calls;
        for (int m = 0; m < n; ++m)
          calls.emplace_back(global_of(st, m), st.arrivals[static_cast<std::size_t>(m)]->desc.caller);
        Failure f{FailKind::mismatch, name_,
                  mismatch_text(calls, "collective mismatch in " + group_str(key.first) + " at seq " +
                                           std::to_string(key.second) + ": rank " + std::to_string(global_of(st, 0)) +
                                           " called " + ref.str() + " but rank " + std::to_string(global_of(st, g)) +
                                           " called " + d.str())};
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
        if (peer != rank) self->send(actor_of(peer), done_atom::value, key.first, key.second);
      }
    } else {
      st.n_done = n;
    }
  }
  if (st.n_done < n) return;
  op->promise.set_value();
  if (net && st.small) keep_arrivals(key, st);
  colls.erase(it);
}

std::vector<int> RankState::missing(const CollState& st) const {
  std::vector<int> out;
  for (std::size_t g = 0; g < st.arrivals.size(); ++g)
    if (!st.arrivals[g]) out.push_back((*st.members)[g]);
  return out;
}

void RankState::break_group(std::uint64_t gid, const Failure& why) {
  broken.emplace(gid, why);
  for (auto it = colls.begin(); it != colls.end();) {
    if (it->first.first == gid) {
      if (it->second.local) {
        Failure f = why;
        f.op = it->second.local->desc.who();
        fail(it->second.local, f);
      }
      it = colls.erase(it);
    } else {
      ++it;
    }
  }
}

void RankState::on_timeout(std::uint64_t gid, std::uint64_t seq) {
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
  Failure f{FailKind::timeout, op.desc.who(), msg};
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
    if (peer != rank) self->send(actor_of(peer), abort_atom::value, gid, rank, later.msg);
}

void RankState::on_abort(std::uint64_t gid, int /*from*/, const std::string& msg) {
  if (broken.count(gid)) return;
  break_group(gid, Failure{FailKind::timeout, "", msg});
}

}  // namespace dopt::detail
