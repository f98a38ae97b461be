// The RPC membership agreement (rpc_membership.hpp): a coordinator gathers
// every member's view of the lost workers, then commits a new epoch on every
// survivor once each of them sees the lost ones lost (so their agents drop
// any late request from them).
#include "dopt/actors/rpc_membership.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "rpc/core.hpp"

namespace dopt::rpc {

namespace {

struct Entry {
  std::weak_ptr<AgentCore> agent;  // expired: a stale entry of an agent that is gone
  std::uint64_t epoch = 0;
  std::vector<int> members;
};

std::mutex g_mutex;
// Keyed by the agent's core (an identity per worker, also between simulated
// workers of one process) and the line.
std::map<std::pair<const void*, std::uint64_t>, Entry>& table() {
  static std::map<std::pair<const void*, std::uint64_t>, Entry> t;
  return t;
}

/// The entry of (a, line), or null; drops entries of agents that are gone
/// (their core's address may be reused by a new agent). Under g_mutex.
Entry* find_locked(const Agent& a, std::uint64_t line) {
  auto it = table().find({a.core().get(), line});
  if (it == table().end()) return nullptr;
  if (it->second.agent.lock() != a.core()) {
    table().erase(it);
    return nullptr;
  }
  return &it->second;
}

std::string ranks_str(const std::vector<int>& r) {
  std::string s = "[";
  for (std::size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s + "]";
}

/// A member's commit: waits until its agent sees every lost worker lost,
/// then records the epoch (never going back).
void commit_here(const Agent& a, std::uint64_t line, std::uint64_t epoch, const std::vector<int>& members,
                 const std::vector<int>& lost, std::chrono::milliseconds timeout) {
  const char* op = "rpc.agree_membership";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r : lost) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!a.wait_until_lost(r, std::max(left, std::chrono::milliseconds(0))))
      throw TimeoutError(op, a.core()->who(a.rank()) + " did not see " + a.core()->who(r) + " lost within " +
                                 std::to_string(timeout.count()) + " ms (the coordinator of line " +
                                 std::to_string(line) + " did)", a.rank());
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  (void)find_locked(a, line);  // a stale entry goes
  auto& e = table()[{a.core().get(), line}];
  e.agent = a.core();
  if (epoch < e.epoch)
    throw StateError(op, "line " + std::to_string(line) + " is at epoch " + std::to_string(e.epoch) + " on " +
                             a.core()->who(a.rank()) + ", the coordinator proposed " + std::to_string(epoch) +
                             " (two coordinators on one line?)", a.rank());
  e.epoch = epoch;
  e.members = members;
}

std::vector<int> sorted_unique(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

std::vector<int> lost_workers(const Agent& agent) {
  auto& c = *agent.core();
  std::lock_guard<std::mutex> lock(c.st_mutex);
  return std::vector<int>(c.lost.begin(), c.lost.end());
}

std::uint64_t membership_epoch(const Agent& agent, std::uint64_t line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Entry* e = find_locked(agent, line);
  return e ? e->epoch : 0;
}

std::vector<int> membership_members(const Agent& agent, std::uint64_t line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Entry* e = find_locked(agent, line);
  return e ? e->members : std::vector<int>();
}

void forget_membership(const Agent& agent, std::uint64_t line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  table().erase({agent.core().get(), line});
}

void register_membership_functions() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_function("dopt.rpc.membership.view", [](Agent& a, std::uint64_t line) {
      return std::make_pair(lost_workers(a), membership_epoch(a, line));
    });
    register_function("dopt.rpc.membership.commit",
                      [](Agent& a, std::uint64_t line, std::uint64_t epoch, std::vector<int> members,
                         std::vector<int> lost, std::int64_t timeout_ms) {
                        commit_here(a, line, epoch, members, lost, std::chrono::milliseconds(timeout_ms));
                      });
  });
}

Membership agree_membership(const Agent& me, std::uint64_t line, const std::vector<int>& members_in,
                            const MembershipOptions& options) {
  register_membership_functions();
  const char* op = "rpc.agree_membership";
  const std::vector<int> members = sorted_unique(members_in);
  if (!std::binary_search(members.begin(), members.end(), me.rank()))
    throw ValueError(op, "the coordinator " + me.core()->who(me.rank()) + " is not one of the members " +
                             ranks_str(members), me.rank());
  const auto timeout = options.timeout.value_or(me.options().rpc_timeout);
  Fn view("dopt.rpc.membership.view");
  view.timeout = timeout;
  Fn commit("dopt.rpc.membership.commit");
  // A member may wait up to `timeout` for its verdict before it answers.
  commit.timeout = timeout * 2;

  std::set<int> lost;
  for (int r : lost_workers(me))
    if (std::binary_search(members.begin(), members.end(), r)) lost.insert(r);
  std::uint64_t epoch = membership_epoch(me, line);
  std::string why;
  for (std::size_t round = 0; round <= 2 * members.size() + 1; ++round) {
    std::vector<int> alive;
    for (int r : members)
      if (!lost.count(r)) alive.push_back(r);
    // 1. every member's view of the lost
    std::vector<std::pair<int, Future<std::pair<std::vector<int>, std::uint64_t>>>> views;
    for (int r : alive)
      if (r != me.rank()) views.emplace_back(r, me.rpc_async<std::pair<std::vector<int>, std::uint64_t>>(r, view, line));
    bool grew = false;
    for (auto& [r, f] : views) {
      try {
        auto [seen, e] = f.get();
        epoch = std::max(epoch, e);
        for (int x : seen)
          if (std::binary_search(members.begin(), members.end(), x) && lost.insert(x).second) grew = true;
      } catch (const PeerLostError& e) {
        lost.insert(r);
        grew = true;
        why = e.detail();
      }
    }
    for (int r : lost_workers(me))
      if (std::binary_search(members.begin(), members.end(), r) && lost.insert(r).second) grew = true;
    if (grew) continue;
    // 2. commit the next epoch on every survivor
    ++epoch;
    const std::vector<int> gone(lost.begin(), lost.end());
    std::vector<std::pair<int, Future<void>>> commits;
    for (int r : alive)
      if (r != me.rank())
        commits.emplace_back(r, me.rpc_async<void>(r, commit, line, epoch, alive, gone,
                                                   static_cast<std::int64_t>(timeout.count())));
    std::exception_ptr mine;
    try {
      commit_here(me, line, epoch, alive, gone, timeout);
    } catch (...) {
      mine = std::current_exception();
    }
    bool again = false;
    std::exception_ptr other;
    for (auto& [r, f] : commits) {
      try {
        f.get();
      } catch (const PeerLostError& e) {
        lost.insert(r);
        again = true;
        why = e.detail();
      } catch (...) {
        if (!other) other = std::current_exception();
      }
    }
    if (mine) std::rethrow_exception(mine);
    if (other) std::rethrow_exception(other);
    if (again) continue;  // the survivors commit again, without it, under a higher epoch
    Membership m;
    m.line = line;
    m.epoch = epoch;
    m.members = alive;
    m.lost = gone;
    return m;
  }
  throw PeerLostError(op, "the members " + ranks_str(members) + " of line " + std::to_string(line) +
                              " could not agree: a member was lost in every round (" + why + ")", me.rank());
}

}  // namespace dopt::rpc
