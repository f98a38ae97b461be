// Between processes, a small call's arrivals travel one message per member;
// a process killed while they leave it (or whose last bytes never left it)
// reaches some members and not others. Those with its arrival complete the
// call (a small call is computed from the arrivals alone); the others would
// fail it with PeerLostError, and the survivors would disagree about which
// calls completed (issue 45: they then shrank different groups and waited
// for each other until the timeout).
//
// So a member that lacks a lost member's arrival asks the other members for
// it before failing the call. A member that holds it (the call pending, or
// among the group's latest completed calls, which it keeps) relays it. One
// that does not answers once no copy can still be on its way to it: when the
// copy comes (then it relays it), or once its own connection to the lost
// member closed (messages of one connection arrive in order, so nothing more
// comes), or a heartbeat period after it learned of the loss otherwise (a
// stopped or cut-off member); then it answers no and refuses that arrival
// from then on. Who holds it is thus fixed once answered: the call completes
// on every survivor when any held it, and fails on every survivor when none
// did (docs/fault-tolerance.md, "Shrinking a group").
#include <algorithm>

#include "transport/actor/rank_state.hpp"

namespace dopt::detail {
namespace {

/// How many completed small calls of each group keep their arrivals: with
/// blocking calls a survivor is at most one call of a group behind another.
constexpr std::size_t kKeptCalls = 2;

NetArrival to_net(const Arrival& a) {
  NetArrival na;
  na.gid = a.gid;
  na.seq = a.seq;
  na.from = a.from;
  na.members = *a.members;
  na.desc = a.desc;
  for (const Tensor& t : a.tensors) {
    NetBuf b;
    if (t.defined()) {
      b.present = true;
      b.dtype = t.dtype();
      b.shape = t.shape();
      b.bytes = t.nbytes();
      const char* p = static_cast<const char*>(t.data_ptr());
      b.data.assign(p, p + t.nbytes());
    }
    na.bufs.push_back(std::move(b));
  }
  return na;
}

}  // namespace

bool RankState::ask_for_arrival(CollKey key, CollState& st, int g) {
  if (st.asked.count(g)) return true;
  std::set<int> ask;
  const int lost_member = global_of(st, g);
  for (int m : *st.members)
    if (m != rank && m != lost_member && !lost.count(m)) ask.insert(m);
  if (ask.empty()) return false;
  for (int m : ask) self->send(actor_of(m), want_atom::value, key.first, key.second, g, lost_member, rank);
  st.asked.emplace(g, std::move(ask));
  return true;
}

void RankState::on_want(std::uint64_t gid, std::uint64_t seq, int g, int lost_rank, int asker) {
  if (asker < 0 || asker >= world || asker == rank || dead.count(asker) || g < 0) return;
  ArrivalPtr held;
  if (auto it = colls.find({gid, seq}); it != colls.end() && static_cast<std::size_t>(g) < it->second.arrivals.size())
    held = it->second.arrivals[static_cast<std::size_t>(g)];
  if (auto k = kept.find(gid); !held && k != kept.end())
    for (const auto& [s, arrivals] : k->second)
      if (s == seq && static_cast<std::size_t>(g) < arrivals.size()) held = arrivals[static_cast<std::size_t>(g)];
  if (!held && !dead.count(lost_rank)) {  // a copy may still be on its way here
    Deferred& d = deferred[{gid, seq, g}];
    if (d.askers.empty()) {
      d.lost_rank = lost_rank;
      d.tick = ticks;
    }
    d.askers.insert(asker);
    return;
  }
  if (!held) refused.emplace(gid, seq, g);
  self->send(actor_of(asker), have_atom::value, gid, seq, g, rank, held != nullptr,
             held ? to_net(*held) : NetArrival{});
}

void RankState::answer_deferred(std::uint64_t gid, std::uint64_t seq, int g, const ArrivalPtr& held) {
  auto it = deferred.find({gid, seq, g});
  if (it == deferred.end()) return;
  if (!held) refused.emplace(gid, seq, g);
  for (int asker : it->second.askers)
    if (!dead.count(asker))
      self->send(actor_of(asker), have_atom::value, gid, seq, g, rank, held != nullptr,
                 held ? to_net(*held) : NetArrival{});
  deferred.erase(it);
}

void RankState::settle_deferred(int peer, bool all) {
  std::vector<std::tuple<std::uint64_t, std::uint64_t, int>> due;
  for (const auto& [k, d] : deferred)
    if ((peer < 0 ? lost.count(d.lost_rank) > 0 : d.lost_rank == peer) && (all || d.tick + 1 < ticks)) due.push_back(k);
  for (const auto& [gid, seq, g] : due) answer_deferred(gid, seq, g, nullptr);
  auto settles = [&](int lost_rank, std::uint64_t tick) {
    return (peer < 0 ? lost.count(lost_rank) > 0 : lost_rank == peer) && (all || tick + 1 < ticks);
  };
  for (auto it = colls.begin(); it != colls.end();) {
    CollState& st = it->second;
    int gone_g = -1;
    for (const auto& [g, tick] : st.closing)
      if (!st.arrivals[static_cast<std::size_t>(g)] && settles(global_of(st, g), tick)) gone_g = g;
    if (gone_g < 0 || !st.local) {
      ++it;
      continue;
    }
    fail(st.local, lost_failure_of(it->first, st, global_of(st, gone_g)));
    failed.insert(it->first);
    it = colls.erase(it);
  }
}

void RankState::on_have(std::uint64_t gid, std::uint64_t seq, int g, int from, bool has, NetArrival& na) {
  const CollKey key{gid, seq};
  auto it = colls.find(key);
  if (it == colls.end()) return;  // completed or failed here meanwhile
  CollState& st = it->second;
  auto q = st.asked.find(g);
  if (q == st.asked.end() || static_cast<std::size_t>(g) >= st.arrivals.size()) return;
  q->second.erase(from);
  if (st.arrivals[static_cast<std::size_t>(g)]) return;
  if (has && na.gid == gid && na.seq == seq && na.from == g) {
    st.asked.erase(q);
    return on_net_arrive(na, true);  // completes the call when it was the last arrival missing
  }
  if (!q->second.empty() || !no_copy_left(st, g)) return;
  if (st.local) fail(st.local, lost_failure_of(key, st, global_of(st, g)));
  failed.insert(key);
  colls.erase(it);
}

bool RankState::no_copy_left(CollState& st, int g) {
  if (dead.count(global_of(st, g))) return true;
  st.closing.emplace(g, ticks);  // this rank's own copy may still be on its way
  return false;
}

bool RankState::asking_ends(CollState& st, int peer) {
  bool ends = false;
  for (auto& [g, waiting] : st.asked)
    if (waiting.erase(peer) && waiting.empty() && !st.arrivals[static_cast<std::size_t>(g)] && no_copy_left(st, g))
      ends = true;
  return ends;
}

void RankState::keep_arrivals(CollKey key, CollState& st) {
  std::vector<ArrivalPtr> arrivals = st.arrivals;
  if (st.local) arrivals[static_cast<std::size_t>(st.local->my_grank)] = nullptr;  // the caller's tensors
  auto& calls = kept[key.first];
  calls.emplace_back(key.second, std::move(arrivals));
  while (calls.size() > kKeptCalls) calls.pop_front();
}

}  // namespace dopt::detail
