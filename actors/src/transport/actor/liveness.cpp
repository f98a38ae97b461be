// Liveness of the peers as the rank actor sees it: peers whose user code
// failed (lost), whose process is gone (down messages, passed on as gone),
// or that fell silent (no heartbeat for peer_timeout). Every pending call
// that needs such a peer fails with PeerLostError naming it, on the actor
// plane here and on the data planes through the PeerTable.
#include <algorithm>

#include "dopt/runtime/internal/shm.hpp"
#include "transport/actor/rank_state.hpp"

namespace dopt::detail {

/// PeerLostError for call `key`, naming the first of its members that was
/// lost (`peer` when none was before it).
Failure RankState::lost_failure_of(CollKey key, const CollState& st, int peer) const {
  for (int q : lost_order) {
    if (q == rank || std::find(st.members->begin(), st.members->end(), q) == st.members->end()) continue;
    peer = q;
    break;
  }
  return Failure{FailKind::peer_lost, st.local->desc.who(),
                 "rank " + std::to_string(peer) + " was lost during " + st.local->desc.str() + " in " +
                     group_str(key.first) + " (seq " + std::to_string(key.second) + "): " + lost.at(peer)};
}

/// A peer is lost. actor_dead: its actor is gone too (it will finish
/// nothing). gone: its process is gone (seen here or by another rank), so
/// the TCP connection to it is cut and ring collectives with it fail.
/// pass_on: tell the other ranks (net), so that each names this peer even
/// if it would first see a survivor exit. certain: the loss is known (a
/// closed connection, a failure report), not only suspected (silence); it
/// goes with what is passed on and into the PeerTable for shrink's majority
/// rule. Seen just after this process did not run for longer than the peer
/// timeout (in_doubt), a loss is only suspected whatever its kind: the peer
/// may have gone on without this rank, or finished, while it was stopped.
void RankState::on_lost(int peer, const std::string& what_seen, bool actor_dead, bool gone, bool pass_on,
                        bool certain) {
  if (peer == rank) return;
  std::string what = what_seen;
  if (!removed && certain && in_doubt(std::chrono::steady_clock::now())) {
    certain = false;
    what += " (seen " + std::to_string(doubt_gap.count()) + " ms after this process last ran: not certain)";
  }
  if (table) table->mark(peer, actor_dead || gone ? PeerTable::lost : PeerTable::failed, what, certain);
  const bool first = lost.emplace(peer, what).second;
  if (first) lost_order.push_back(peer);
  if (actor_dead) dead.insert(peer);
  // What a dead process left in /dev/shm (segments named after its pid).
  if (net && first && (actor_dead || gone)) shm::remove_stale_segments();
  if (gone && mesh && !mesh->peer_lost(peer))
    mesh->fail_peer(peer, "rank " + std::to_string(peer) + " is lost: " + what);
  if (pass_on && first && net)
    for (int k = 0; k < world; ++k)
      if (k != rank && k != peer && !dead.count(k))
        self->send(actor_of(k), gone_atom::value, peer, what, certain);
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
        fails = !st.arrivals[g] || (actor_dead && owes_work);
        // Between processes, its arrival of a small call may have reached
        // another member: asked for before the call fails (relay.cpp).
        if (fails && net && st.small && !st.arrivals[g] && ask_for_arrival(it->first, st, static_cast<int>(g)))
          fails = false;
      }
      if (!fails) fails = asking_ends(st, peer);
    }
    if (fails) {
      fail(st.local, lost_failure_of(it->first, st, peer));
      failed.insert(it->first);
      it = colls.erase(it);
    } else {
      ++it;
    }
  }
  // Fails, and forgets, the point-to-point calls whose other end is peer.
  const auto fail_p2p = [&](std::map<P2PKey, OpPtr>& calls, int P2PKey::*other_end, const char* kind,
                            const char* before) {
    for (auto it = calls.begin(); it != calls.end();) {
      if (it->first.*other_end == peer) {
        fail(it->second, Failure{FailKind::peer_lost, kind,
                                 "rank " + std::to_string(peer) + " was lost before " + before + ": " + what});
        it = calls.erase(it);
      } else {
        ++it;
      }
    }
  };
  fail_p2p(recvs, &P2PKey::src, "recv", "sending");
  if (actor_dead) fail_p2p(sends, &P2PKey::dst, "send", "receiving");
  // Nothing more comes from it here: questions about its arrivals are answered (relay.cpp).
  if (actor_dead) settle_deferred(peer, true);
  answer_admission_waiter();  // a newcomer in join_group() whose members are all gone (revive.cpp)
}

/// Net: heartbeat every peer_timeout / 4; a peer silent for peer_timeout is lost.
/// Heartbeats go out every peer_timeout / 10 and silence is checked as
/// often, so a stopped peer is declared lost between 0.9 and 1.1
/// peer_timeouts after it stopped, and the message gives the silence measured.
void RankState::on_heartbeat_tick() {
  const auto now = std::chrono::steady_clock::now();
  in_doubt(now);  // a tick later than the peer timeout: this process did not run that long
  // A tick far later than planned means this process did not run (suspended
  // with Ctrl-Z or SIGSTOP, or starved): its peers' silence meanwhile says
  // nothing about them, so it starts counting again.
  if (last_tick.time_since_epoch().count() != 0 && now - last_tick > 3 * heartbeat_period(peer_timeout))
    std::fill(last_heard.begin(), last_heard.end(), now);
  last_tick = now;
  ++ticks;
  settle_deferred(-1, false);  // a heartbeat period after the loss was learned (relay.cpp)
  for (const auto& [r, w] : waiting) self->send(w.actor, hb_atom::value, rank);  // replacements (revive.cpp)
  for (int r = 0; r < world; ++r) {
    if (r == rank || dead.count(r)) continue;
    self->send(actor_of(r), hb_atom::value, rank);
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard[static_cast<std::size_t>(r)]);
    if (silent > peer_timeout) {
      const std::string what = "no word from its process for " + std::to_string(silent.count()) +
                               " ms (stopped, hung or cut off; the limit is " + std::to_string(peer_timeout.count()) +
                               " ms)";
      on_lost(r, what, true, true, true, false);  // suspected: it may be running, cut off
    }
  }
  self->delayed_send(self, heartbeat_period(peer_timeout), hbtick_atom::value);
}

void RankState::on_self_failed(const std::string& what) {
  if (self_failed) return;
  self_failed = true;
  self_failed_what = what;
  for (int peer = 0; peer < world; ++peer)
    if (peer != rank) self->send(actor_of(peer), lost_atom::value, rank, what);
  for (auto& [key, a] : unmatched) reply_lost(a->key);
  unmatched.clear();
}

int RankState::rank_of(const caf::strong_actor_ptr& who) const {
  if (!who) return -1;
  for (int r = 0; r < world; ++r)
    if (r != rank && actor_of(r).address() == who->address()) return r;
  return -1;
}

void RankState::watch(int peer_rank) {
  if (peer_rank == rank || peer_rank < 0 || peer_rank >= world) return;
  const auto i = static_cast<std::size_t>(peer_rank);
  if (watched[i]) return;
  watched[i] = true;
  self->monitor(actor_of(peer_rank));  // an actor already gone: its down message comes at once
}

void RankState::fence(int peer) {
  if (removed) return;  // a removed rank removes nobody
  auto it = lost.find(peer);
  self->send(actor_of(peer), fence_atom::value, rank,
             it == lost.end() ? std::string("it was lost") : it->second);
}

void RankState::on_fenced(int by, const std::string& why) {
  if (removed || by < 0 || by >= world || by == rank) return;
  remove_self("rank " + std::to_string(by) + " had declared this rank (" + std::to_string(rank) + ") lost (" + why +
              ") and heard from it again: it was removed from the job");
}

bool RankState::in_doubt(std::chrono::steady_clock::time_point now) {
  if (!net || peer_timeout.count() <= 0 || last_tick.time_since_epoch().count() == 0) return false;
  const auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_tick);
  if (gap > peer_timeout && now + peer_timeout > doubt_until) {
    doubt_until = now + peer_timeout;
    doubt_gap = gap;
  }
  return now < doubt_until;
}

void RankState::remove_self(const std::string& what) {
  if (removed) return;
  removed = true;
  if (table) table->fence(what);
  // Every peer is lost to this rank: its pending and later calls fail.
  for (int r = 0; r < world; ++r)
    if (r != rank) on_lost(r, what, true, true, false);
}

}  // namespace dopt::detail
