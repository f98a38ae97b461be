// rank 0's rendezvous coordinator (rendezvous_coordinator.hpp).
#include "core/rendezvous_coordinator.hpp"

#include <set>

#include "caf/all.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "core/ranks.hpp"
#include "core/compatibility.hpp"

namespace dopt::detail {

namespace {

std::string join_ranks(const std::vector<int>& rs) {
  std::string s;
  for (int r : rs) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

/// Rank 0: which ranks' replacements its rendezvous admits once the world is
/// up (rendezvous_admit_replacements), and the incarnation each slot has now.
/// Shared by the rendezvous port's admit (its own thread) and the coordinator.
struct BarrierState {
  std::set<int> arrived;
  std::vector<caf::response_promise> waiting;
};

struct CoordState {
  int world = 1;
  // Ranks 0..required-1 must join; the world is complete once they have
  // (DOPT_MIN_WORLD_SIZE: the other slots are vacant, lost from the start).
  int required = 1;
  int required_in = 0;  // how many of them have
  Table table;
  Table payloads;
  std::vector<std::string> infos;
  std::vector<bool> have;
  int arrived = 0;
  std::vector<caf::response_promise> pending;
  bool done = false;
  int fail_kind = k_ok;
  std::string fail_msg;
  std::map<std::uint64_t, BarrierState> barriers;
  std::map<std::uint64_t, std::string> failed_barriers;
  // The first failure a rank reported after the registration (it could not
  // connect to a peer, ...): every barrier from then on fails with it.
  std::string setup_failure;
  // The ranks that know of setup_failure (they reported one, or a barrier
  // of theirs failed with it): rank 0 waits a little for all of them before
  // its process goes, since a rank that asks a gone rank 0 learns no cause.
  std::set<int> told;
  // Set once the world is complete: the rendezvous port then turns every
  // newcomer away in its handshake.
  std::shared_ptr<std::atomic<bool>> closed;
  std::shared_ptr<Replacements> replacements;
  // Rank 0's compatibility items (core/compatibility.hpp): a replacement's
  // must be the same.
  std::vector<std::string> compatibility;
  static const char* name;

  void fail_all(int kind, std::string msg) {
    fail_kind = kind;
    fail_msg = std::move(msg);
    for (auto& rp : pending) rp.deliver(fail_kind, fail_msg, Table{}, Table{}, std::vector<std::string>{});
    pending.clear();
  }
};
const char* CoordState::name = "dopt.rendezvous";

caf::behavior coordinator(caf::stateful_actor<CoordState>* self, int world, int required, std::int64_t timeout_ms,
                          std::shared_ptr<std::atomic<bool>> closed, std::string session_key,
                          std::shared_ptr<Replacements> replacements, std::vector<std::string> compatibility) {
  auto& s = self->state;
  s.world = world;
  s.compatibility = std::move(compatibility);
  s.required = required;
  s.closed = std::move(closed);
  s.replacements = std::move(replacements);
  s.table.resize(static_cast<std::size_t>(world));
  s.payloads.resize(static_cast<std::size_t>(world));
  s.infos.resize(static_cast<std::size_t>(world));
  s.have.assign(static_cast<std::size_t>(world), false);
  self->delayed_send(self, std::chrono::milliseconds(timeout_ms), rdv_tmo_atom::value, timeout_ms);
  // While ranks are missing, rank 0 says so after 10 s and then every 30 s.
  if (timeout_ms > 10000) self->delayed_send(self, std::chrono::seconds(10), rdv_note_atom::value, std::int64_t{10000});
  // A rank that registered and is then lost before the world is complete
  // fails every rank at once (the world cannot form without it), naming it.
  // Once the world is up: an admitted newcomer whose rendezvous actor is
  // gone (its process ended, or its init_process_group returned or failed)
  // holds the others back no longer.
  self->set_down_handler([self](const caf::down_msg& dm) {  // (dm.reason: remote_link_unreachable)
    auto& st = self->state;
    if (st.done && st.replacements) {
      for (int r = 1; r < st.world; ++r)
        if (const auto& a = st.table[static_cast<std::size_t>(r)]; a && a.address() == dm.source) {
          std::lock_guard<std::mutex> lock(st.replacements->mutex);
          st.replacements->admitted_at.erase(r);
        }
      return;
    }
    if (st.done || st.fail_kind != k_ok) return;
    for (int r = 0; r < st.world; ++r)
      if (st.have[static_cast<std::size_t>(r)] && st.table[static_cast<std::size_t>(r)].address() == dm.source) {
        st.fail_all(k_peer, "rank " + std::to_string(r) +
                                " joined the rendezvous and was lost before every rank had joined (its process "
                                "died or its connection broke); the world cannot form without it");
        return;
      }
  });
  return {
      [self, timeout_ms](rdv_note_atom, std::int64_t after_ms) {
        auto& st = self->state;
        if (st.done || st.fail_kind != k_ok) return;
        std::vector<int> missing;
        for (int r = 0; r < st.required; ++r)
          if (!st.have[static_cast<std::size_t>(r)]) missing.push_back(r);
        notice("rendezvous [rank 0]: " + std::to_string(st.required_in) + " of " + std::to_string(st.required) +
               (st.required < st.world ? " required" : "") + " ranks have joined after " +
               std::to_string(after_ms / 1000) + " s; waiting for rank" +
               (missing.size() == 1 ? " " : "s ") + join_ranks(missing) + " (the limit is " +
               std::to_string(timeout_ms / 1000) + " s; a rank that never started, or that cannot reach " +
               "this one, is the usual cause)");
        const std::int64_t next = after_ms + 30000;
        if (next < timeout_ms) self->delayed_send(self, std::chrono::milliseconds(next - after_ms), rdv_note_atom::value, next);
      },
      [self](rdv_reg_atom, int rank, int world_, const caf::actor& who, const caf::actor& payload,
             const std::string& info) {
        auto& st = self->state;
        auto rp = self->make_response_promise();
        if (st.fail_kind != k_ok) {
          rp.deliver(st.fail_kind, st.fail_msg, Table{}, Table{}, std::vector<std::string>{});
          return;
        }
        std::string problem;
        if (world_ != st.world)
          problem = "rank " + std::to_string(rank) + " has world size " + std::to_string(world_) +
                    " but rank 0 has world size " + std::to_string(st.world) +
                    " (every process needs the same WORLD_SIZE)";
        else if (rank < 0 || rank >= st.world)
          problem = "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(st.world) + ")";
        else if (st.have[static_cast<std::size_t>(rank)])
          problem = "rank " + std::to_string(rank) +
                    " registered twice: two processes were started with the same RANK=" + std::to_string(rank) +
                    " (rank " + std::to_string(rank) + " is already taken)";
        else if (st.done)
          problem = "rank " + std::to_string(rank) + " comes after the world started with ranks 0.." +
                    std::to_string(st.required - 1) + " of " + std::to_string(st.world) +
                    " (DOPT_MIN_WORLD_SIZE): its slot is vacant and it joins as a newcomer (DOPT_REPLACES=" +
                    std::to_string(rank) + ", which dopt-run --nnodes MIN:MAX sets on a node K >= MIN)";
        if (!problem.empty()) {
          if (st.done) {  // the others are through already: only the newcomer fails
            rp.deliver(static_cast<int>(k_value), problem, Table{}, Table{}, std::vector<std::string>{});
            return;
          }
          st.pending.push_back(rp);
          st.fail_all(k_value, problem);
          return;
        }
        st.have[static_cast<std::size_t>(rank)] = true;
        st.table[static_cast<std::size_t>(rank)] = who;
        if (rank != 0) self->monitor(who);
        st.payloads[static_cast<std::size_t>(rank)] = payload;
        st.infos[static_cast<std::size_t>(rank)] = info;
        ++st.arrived;
        if (rank < st.required) ++st.required_in;
        st.pending.push_back(rp);
        if (st.required_in == st.required) {
          st.done = true;
          if (st.closed) st.closed->store(true);
          for (auto& p : st.pending) p.deliver(static_cast<int>(k_ok), std::string(), st.table, st.payloads, st.infos);
          st.pending.clear();
        }
      },
      // A replacement of a lost rank, once the world is up: it takes the
      // rank's slot (a later incarnation than any before) and gets every
      // rank's handle and info, but none of the ranks rank 0 sees lost.
      [self](rdv_rejoin_atom, int rank, int world_, int incarnation, const caf::actor& who,
             const caf::actor& payload, const std::string& info, const std::vector<std::string>& compatibility) {
        auto& st = self->state;
        auto refuse = [](int kind, std::string why) {
          return caf::make_message(kind, std::move(why), Table{}, Table{}, std::vector<std::string>{});
        };
        if (!st.done)
          return refuse(k_state, "rank " + std::to_string(rank) + " cannot be replaced before every rank has joined");
        if (world_ != st.world || rank <= 0 || rank >= st.world)
          return refuse(k_value, "rank " + std::to_string(rank) + " of a world of " + std::to_string(world_) +
                                     " cannot replace a rank of this world of " + std::to_string(st.world) +
                                     " (rank 0 cannot be replaced)");
        // Started with other settings than the job (InitOptions::compatibility
        // and the launch facts): refused whatever else holds, and at once.
        // A late node's first process (a vacant slot's incarnation 1) is "this node".
        const bool late_node = rank >= st.required && incarnation == 1;
        if (const std::string diffs =
                compatibility_differences(st.compatibility, compatibility, late_node ? "this node" : "this process");
            !diffs.empty())
          return refuse(k_value, "it was started with other settings than the running job (" +
                                     diffs + "); start it with the job's settings");
        if (const std::string why = st.replacements->judge(rank); !why.empty())
          return refuse(k_value, "rank 0 does not admit a replacement of rank " + std::to_string(rank) + ": " + why);
        const auto now = std::chrono::steady_clock::now();
        for (const auto& [other, when] : st.replacements->admitted_at)
          if (other != rank && now - when < st.replacements->settle && st.replacements->judge(other).empty())
            return refuse(k_value, "rank 0 does not admit a replacement of rank " + std::to_string(rank) +
                                       " now: rank " + std::to_string(other) +
                                       "'s newcomer was admitted and has not been taken in yet; the world is "
                                       "already closed to other newcomers until then (one joins at a time)");
        {
          std::lock_guard<std::mutex> lock(st.replacements->mutex);
          int& last = st.replacements->incarnation[rank];
          if (incarnation <= last)
            return refuse(k_value, "incarnation " + std::to_string(incarnation) + " of rank " +
                                       std::to_string(rank) + " is stale: incarnation " + std::to_string(last) +
                                       " was admitted already (another process took rank " + std::to_string(rank) +
                                       "'s slot)");
          last = incarnation;
          st.replacements->admitted_at[rank] = now;  // (a stale one does not hold the others back)
        }
        self->monitor(who);  // (its end lets the next newcomer in: the down handler)
        const auto i = static_cast<std::size_t>(rank);
        st.table[i] = who;
        st.payloads[i] = payload;
        st.infos[i] = info;
        Table payloads = st.payloads;
        std::vector<std::string> infos = st.infos;
        for (int r = 1; r < st.world; ++r)
          if (r != rank && st.replacements->judge(r).empty()) {
            payloads[static_cast<std::size_t>(r)] = caf::actor();
            infos[static_cast<std::size_t>(r)].clear();
          }
        return caf::make_message(static_cast<int>(k_ok), std::string(), st.table, std::move(payloads),
                                 std::move(infos));
      },
      [self](rdv_tmo_atom, std::int64_t ms) {
        auto& st = self->state;
        if (st.done || st.fail_kind != k_ok) return;
        std::vector<int> missing, present;
        for (int r = 0; r < st.world; ++r)
          if (st.have[static_cast<std::size_t>(r)]) present.push_back(r);
          else if (r < st.required) missing.push_back(r);
        st.fail_all(k_timeout, "timed out after " + std::to_string(ms) + " ms: missing ranks: " + join_ranks(missing) +
                                   " (arrived: " + (present.empty() ? "none" : join_ranks(present)) +
                                   " of world size " + std::to_string(st.world) +
                                   (st.required < st.world ? ", of which ranks 0.." + std::to_string(st.required - 1) +
                                                                 " must join (DOPT_MIN_WORLD_SIZE)"
                                                           : std::string()) +
                                   ")");
      },
      [self](rdv_bar_atom, std::uint64_t seq, int rank, std::int64_t ms) {
        auto& st = self->state;
        auto rp = self->make_response_promise();
        if (!st.setup_failure.empty()) {
          st.told.insert(rank);
          rp.deliver(static_cast<int>(k_peer), st.setup_failure, Table{}, Table{}, std::vector<std::string>{});
          return;
        }
        if (auto f = st.failed_barriers.find(seq); f != st.failed_barriers.end()) {
          rp.deliver(static_cast<int>(k_timeout), f->second, Table{}, Table{}, std::vector<std::string>{});
          return;
        }
        auto [it, fresh] = st.barriers.try_emplace(seq);
        if (fresh) self->delayed_send(self, std::chrono::milliseconds(ms), rdv_btmo_atom::value, seq, ms);
        it->second.arrived.insert(rank);
        it->second.waiting.push_back(rp);
        if (static_cast<int>(it->second.arrived.size()) == st.arrived) {  // every rank present
          for (auto& p : it->second.waiting)
            p.deliver(static_cast<int>(k_ok), std::string(), Table{}, Table{}, std::vector<std::string>{});
          st.barriers.erase(it);
        }
      },
      [self](rdv_btmo_atom, std::uint64_t seq, std::int64_t ms) {
        auto& st = self->state;
        auto it = st.barriers.find(seq);
        if (it == st.barriers.end()) return;
        std::vector<int> missing;
        for (int r = 0; r < st.world; ++r)
          if (st.have[static_cast<std::size_t>(r)] && !it->second.arrived.count(r)) missing.push_back(r);
        std::string msg = "barrier " + std::to_string(seq) + " timed out after " + std::to_string(ms) +
                          " ms: missing ranks: " + join_ranks(missing);
        for (auto& p : it->second.waiting)
          p.deliver(static_cast<int>(k_timeout), msg, Table{}, Table{}, std::vector<std::string>{});
        st.barriers.erase(it);
        st.failed_barriers.emplace(seq, msg);
      },
      [self](rdv_fail_atom, int rank, const std::string& what) {
        auto& st = self->state;
        st.told.insert(rank);
        if (!st.setup_failure.empty()) return;
        st.setup_failure = "rank " + std::to_string(rank) + " failed while the ranks connected to each other: " + what;
        for (auto& [seq, b] : st.barriers) {
          st.told.insert(b.arrived.begin(), b.arrived.end());
          for (auto& p : b.waiting)
            p.deliver(static_cast<int>(k_peer), st.setup_failure, Table{}, Table{}, std::vector<std::string>{});
          st.failed_barriers.emplace(seq, st.setup_failure);
        }
        st.barriers.clear();
      },
      [self](rdv_why_atom) { return self->state.setup_failure; },
      [self](rdv_told_atom) {
        const auto& st = self->state;
        for (int r = 1; r < st.world; ++r)
          if (st.have[static_cast<std::size_t>(r)] && !st.told.count(r)) return false;
        return true;
      },
      // The key of the ranks' own ports in a job without a secret (asked
      // before a rank opens them; "" in a job with one).
      [session_key](rdv_key_atom) {
        return caf::make_message(static_cast<int>(k_ok), session_key, Table{}, Table{}, std::vector<std::string>{});
      },
      [](rdv_ping_atom) { return 0; },
  };
}

caf::behavior member(caf::event_based_actor*) {
  return {[](rdv_ping_atom) { return 0; }};
}

}  // namespace

caf::actor spawn_rendezvous_coordinator(caf::actor_system& sys, int world, int required, std::int64_t timeout_ms,
                                        std::shared_ptr<std::atomic<bool>> closed, std::string session_key,
                                        std::shared_ptr<Replacements> replacements,
                                        std::vector<std::string> compatibility) {
  return sys.spawn(coordinator, world, required, timeout_ms, std::move(closed), std::move(session_key),
                   std::move(replacements), std::move(compatibility));
}

caf::actor spawn_rendezvous_member(caf::actor_system& sys) { return sys.spawn(member); }

[[noreturn]] void throw_reply(int kind, const std::string& msg, int rank) {
  if (kind == k_timeout) throw TimeoutError("rendezvous", msg, rank);
  if (kind == k_peer) throw PeerLostError("rendezvous", msg, rank);
  if (kind == k_value) throw ValueError("rendezvous", msg, rank);
  throw StateError("rendezvous", msg, rank);
}

std::string describe(const caf::actor& a) {
  if (!a) return "vacant";  // a slot nobody joined (DOPT_MIN_WORLD_SIZE)
  return std::to_string(a.id()) + "@" + caf::to_string(a.node());
}

}  // namespace dopt::detail
