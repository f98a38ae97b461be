// The rank actor's behaviour: which message runs which part of RankState.
#include "transport/actor/rank_state.hpp"

namespace dopt::detail {

std::exception_ptr current_as_error(const std::string& op, int rank) {
  try {
    throw;
  } catch (const Error&) {
    return std::current_exception();
  } catch (const std::exception& e) {
    return std::make_exception_ptr(Error(op, e.what(), rank));
  } catch (...) {
    return std::make_exception_ptr(Error(op, "unknown exception", rank));
  }
}

RankState::~RankState() {
  Failure f{FailKind::state, "Runtime", "the runtime shut down before the operation finished"};
  for (auto& [k, st] : colls)
    if (st.local) fail(st.local, f);
  for (auto& [k, op] : sends) fail(op, f);
  for (auto& [k, op] : recvs) fail(op, f);
}

const char* RankState::name = "dopt.rank";

caf::behavior rank_actor(caf::stateful_actor<RankState>* self, int rank, int world) {
  auto& s = self->state;
  s.self = self;
  s.rank = rank;
  s.world = world;
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    st.forget_waiting(dm.source);  // a replacement that died waiting (revive.cpp)
    for (int r = 0; r < st.world; ++r) {
      if (r == st.rank || st.actor_of(r).address() != dm.source) continue;
      const bool cut = dm.reason == caf::exit_reason::remote_link_unreachable;
      const std::string what =
          cut ? std::string("the connection to its process was lost (the process died or the network failed)")
              : "its rank actor exited (" + to_string(dm.reason) + ")";
      st.on_lost(r, what, true, cut, cut);
    }
  });
  return {
      [self](init_atom, const PeersPtr& p) {
        // Ranks of this process: peers are monitored when a call needs them (watch).
        auto& st = self->state;
        st.peer_set = p;
        st.table = p->table;
        st.watched.assign(static_cast<std::size_t>(st.world), false);
      },
      [self](initnet_atom, const PeersPtr& p, std::int64_t peer_timeout_ms,
             const std::shared_ptr<transport::TcpMesh>& mesh) {
        // Real processes: peers are remote handles; buffers go through shared
        // memory, or over the TCP mesh when there is one.
        auto& st = self->state;
        st.peer_set = p;
        st.table = p->table;
        st.net = true;
        st.mesh = mesh;
        st.watched.assign(static_cast<std::size_t>(st.world), false);
        // (A replacement's table marks the ranks lost before it joined.)
        for (int r = 0; r < st.world; ++r)
          if (r != st.rank && st.table && st.table->state(r) == PeerTable::lost) {
            st.lost.emplace(r, st.table->why(r));
            st.lost_order.push_back(r);
            st.dead.insert(r);
          } else {
            st.watch(r);
          }
        st.peer_timeout = std::chrono::milliseconds(peer_timeout_ms);
        // The first tick measures from here: a process stopped before it
        // still doubts the losses it sees when it comes back (in_doubt).
        st.last_tick = std::chrono::steady_clock::now();
        st.last_heard.assign(static_cast<std::size_t>(st.world), st.last_tick);
        self->delayed_send(self, heartbeat_period(st.peer_timeout), hbtick_atom::value);
        return true;
      },
      [self](hb_atom, int from) {
        auto& st = self->state;
        if (from < 0 || from >= static_cast<int>(st.last_heard.size())) return;
        auto w = st.waiting.find(from);
        const auto sender = self->current_sender();
        if (w != st.waiting.end() && sender && w->second.actor.address() == sender->address())
          return;  // its replacement, waiting for a grow()
        if (st.table && st.table->incarnation(from) > 0 && sender &&
            st.actor_of(from).address() != sender->address())
          return st.fence_stale(from, sender);  // the process a replacement took over from
        if (st.dead.count(from))
          st.fence(from);  // declared lost, and back (it was stopped or cut off)
        else
          st.last_heard[static_cast<std::size_t>(from)] = std::chrono::steady_clock::now();
      },
      [self](fence_atom, int by, const std::string& why) { self->state.on_fenced(by, why); },
      [self](hbtick_atom) { self->state.on_heartbeat_tick(); },
      [self](ringdone_atom, const RingResultPtr& r) { self->state.on_ring_done(*r); },

      [self](p2precv_atom, const P2PKey& k, const std::string& error) { self->state.on_p2p_received(k, error); },
      [self](arrive_atom, NetArrival& a) { self->state.on_net_arrive(a); },
      [self](want_atom, std::uint64_t gid, std::uint64_t seq, int g, int lost_rank, int asker) {
        self->state.on_want(gid, seq, g, lost_rank, asker);
      },
      [self](have_atom, std::uint64_t gid, std::uint64_t seq, int g, int from, bool has, NetArrival& a) {
        self->state.on_have(gid, seq, g, from, has, a);
      },
      [self](p2p_atom, NetP2P& a) { self->state.on_net_p2p(a); },
      [self](call_atom, const OpPtr& op) { self->state.on_call(op); },
      [self](arrive_atom, const ArrivalPtr& a) { self->state.on_arrive(a); },
      [self](done_atom, std::uint64_t gid, std::uint64_t seq) { self->state.on_done(gid, seq); },
      [self](tmo_atom, std::uint64_t gid, std::uint64_t seq) { self->state.on_timeout(gid, seq); },
      [self](abort_atom, std::uint64_t gid, int from, const std::string& msg) {
        self->state.on_abort(gid, from, msg);
      },
      [self](lost_atom, int peer, const std::string& what) { self->state.on_lost(peer, what, false); },
      [self](gone_atom, int peer, const std::string& what, bool certain) {
        // Only calls the peer never joined fail now: its messages for calls
        // it did join (a done, say) may still be on their way on our own
        // connection, and our own down_msg comes after them.
        // What a peer this rank declared lost says counts for nothing: it
        // was stopped or cut off and its view is stale (it is told so).
        auto& st = self->state;
        const int from = st.rank_of(self->current_sender());
        if (from >= 0 && st.dead.count(from)) return st.fence(from);
        if (!st.dead.count(peer)) st.on_lost(peer, what + ", seen by a peer", false, true, false, certain);
      },
      [self](failed_atom, const std::string& what) { self->state.on_self_failed(what); },
      [self](p2p_atom, const P2PArrivalPtr& a) { self->state.on_p2p(a); },
      [self](revive_atom, int peer, int incarnation, const caf::actor& who, const std::string& endpoint,
             std::int64_t timeout_ms) {
        return self->state.announce(peer, incarnation, who, endpoint, std::chrono::milliseconds(timeout_ms));
      },
      [self](setmesh_atom, const std::shared_ptr<transport::TcpMesh>& mesh) {
        self->state.mesh = mesh;
        return true;
      },
      [self](revivenow_atom, int peer, std::int64_t timeout_ms) {
        return self->state.revive_when_waiting(peer, std::chrono::milliseconds(timeout_ms));
      },
      [self](admit_atom, std::string& text) { self->state.on_admission(std::move(text)); },
      [self](admitwait_atom) { return self->state.wait_admission(); },
      [self](admitsend_atom, int to, const std::string& text) {
        auto& st = self->state;
        if (to >= 0 && to < st.world && to != st.rank && !st.dead.count(to))
          self->send(st.actor_of(to), admit_atom::value, text);
      },
      [self](p2pdone_atom, const P2PReply& r) { self->state.on_p2p_done(r); },
      [self](p2ptmo_atom, const P2PKey& k, bool is_send) { self->state.on_p2p_timeout(k, is_send); },
      [self](p2pcncl_atom, const P2PKey& k) { self->state.on_p2p_cancel(k); },
  };
}

}  // namespace dopt::detail
