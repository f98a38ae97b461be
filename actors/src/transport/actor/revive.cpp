// Growing back between processes (issue 45, docs/growing-back-processes.md
// "Between processes"): a member's rank actor takes a lost rank's
// replacement into its slot, and a newcomer's keeps the admission that
// grow()'s leader sent until join_group() asks for it.
#include <algorithm>

#include "transport/actor/rank_state.hpp"

namespace dopt::detail {

std::string RankState::announce(int peer, int incarnation, const caf::actor& who, const std::string& endpoint,
                                std::chrono::milliseconds timeout) {
  const std::string me = "rank " + std::to_string(rank);
  if (!net || !table || peer < 0 || peer >= world || peer == rank || !who)
    return me + " cannot take rank " + std::to_string(peer) + "'s replacement (not a peer process)";
  if (removed) return me + " was removed from the job";
  if (!dead.count(peer)) return "rank " + std::to_string(peer) + " is alive in " + me + "'s view";
  const int last = std::max(table->incarnation(peer), waiting.count(peer) ? waiting[peer].incarnation : 0);
  if (incarnation <= last)
    return "incarnation " + std::to_string(incarnation) + " of rank " + std::to_string(peer) + " is stale in " + me +
           "'s view (it has seen incarnation " + std::to_string(last) + ")";
  waiting[peer] = Waiting{incarnation, who};
  table->announce(peer, incarnation);
  // Before the answer: the replacement's mesh waits for this connection.
  if (mesh && !endpoint.empty()) mesh->reconnect_peer(peer, endpoint, timeout);
  self->monitor(who);
  // A grow() that took it already (its leader saw it first): revive now.
  if (auto r = revive_requests.find(peer); r != revive_requests.end()) {
    auto request = std::move(r->second);
    revive_requests.erase(r);
    if (std::chrono::steady_clock::now() < request.until) request.promise.deliver(revive(peer));
  }
  return {};
}

caf::result<std::string> RankState::revive_when_waiting(int peer, std::chrono::milliseconds timeout) {
  if (waiting.count(peer) || peer < 0 || peer >= world) return revive(peer);
  revive_requests[peer] = ReviveRequest{self->make_response_promise(), std::chrono::steady_clock::now() + timeout};
  return caf::delegated<std::string>();
}

void RankState::forget_waiting(const caf::actor_addr& gone) {
  for (auto it = waiting.begin(); it != waiting.end(); ++it)
    if (it->second.actor.address() == gone) {
      if (table) table->announce(it->first, 0);
      waiting.erase(it);
      return;
    }
}

void RankState::fence_stale(int peer, const caf::strong_actor_ptr& sender) {
  if (removed) return;
  self->send(caf::actor_cast<caf::actor>(sender), fence_atom::value, rank,
             "rank " + std::to_string(peer) + " was replaced (incarnation " +
                 std::to_string(table ? table->incarnation(peer) : 0) + ")");
}

std::string RankState::revive(int peer) {
  auto w = waiting.find(peer);
  if (w == waiting.end() || !table)
    return "no replacement of rank " + std::to_string(peer) + " waits at rank " + std::to_string(rank);
  const caf::actor who = w->second.actor;
  const int incarnation = w->second.incarnation;
  waiting.erase(w);
  if (!dead.count(peer) || !table->revive(peer, incarnation))
    return "rank " + std::to_string(peer) + "'s replacement (incarnation " + std::to_string(incarnation) +
           ") is stale at rank " + std::to_string(rank);
  // The peer handles are shared (copy on write): the old process's handle
  // goes, so its down message or word no longer counts as the rank's.
  auto next = std::make_shared<Peers>(*peer_set);
  next->actors[static_cast<std::size_t>(peer)] = who;
  peer_set = std::move(next);
  lost.erase(peer);
  lost_order.erase(std::remove(lost_order.begin(), lost_order.end(), peer), lost_order.end());
  dead.erase(peer);
  watched[static_cast<std::size_t>(peer)] = false;
  watch(peer);
  last_heard[static_cast<std::size_t>(peer)] = std::chrono::steady_clock::now();
  return {};
}

void RankState::on_admission(std::string text) {
  if (admission_waiter) {
    admission_waiter->deliver(std::move(text), std::string());
    admission_waiter.reset();
  } else {
    admission = std::move(text);
  }
}

caf::result<std::string, std::string> RankState::wait_admission() {
  if (!admission.empty()) return {std::exchange(admission, std::string()), std::string()};
  if (std::string why = members_gone(); !why.empty()) return {std::string(), std::move(why)};
  admission_waiter = self->make_response_promise();
  return caf::delegated<std::string, std::string>();
}

std::string RankState::members_gone() const {
  const std::string me = "rank " + std::to_string(rank);
  if (removed) return me + " was removed from the job" + (lost.empty() ? std::string() : ": " + lost.begin()->second);
  std::string ranks;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    if (!lost.count(r)) return {};  // alive here: it may still grow a group that takes this rank
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (ranks.empty()) return {};  // a world of one: nobody to wait for, nobody lost either
  const auto zero = lost.find(0);
  return "the job ended: its rank 0 and every other member are gone (ranks " + ranks +
         "), so no member is left to grow a group that takes " + me +
         (zero != lost.end() && rank != 0 ? " (rank 0: " + zero->second + ")" : std::string());
}

void RankState::answer_admission_waiter() {
  if (!admission_waiter) return;
  if (std::string why = members_gone(); !why.empty()) {
    admission_waiter->deliver(std::string(), std::move(why));
    admission_waiter.reset();
  }
}

}  // namespace dopt::detail
