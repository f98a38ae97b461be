#pragma once
// Internal to dopt_actors: what an agent does with each message, as plain
// functions over its state (AgentState). Two links carry the messages:
//   * the CAF actor (agent_actor.cpp): threads and real processes; each
//     handler runs on the actor, its sends are CAF messages;
//   * the simulated mailbox (sim_agent.cpp): rpc::simulate in deterministic
//     mode; each handler runs on the agent's task of the seeded scheduler,
//     its sends go to the peers' mailboxes, its timers are in virtual time.
// A handler runs on one thread at a time per agent and never blocks.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "rpc/core.hpp"

namespace dopt::rpc::detail {

/// A call request as it travels (caller -> callee).
struct Request {
  int caller = -1;
  std::uint64_t id = 0;
  int mode = 0;
  std::string fn;
  std::uint64_t target = 0;
  std::uint64_t new_object = 0;
  std::vector<char> args;
};

/// Where a handler's effects go.
class AgentLink {
 public:
  virtual ~AgentLink() = default;
  /// Sends the request to worker dest.
  virtual void request(int dest, const Request& r) = 0;
  /// Sends the reply of call id to worker dest (its caller).
  virtual void reply(int dest, std::uint64_t id, const ReplyPtr& r) = 0;
  /// handle_timeout(id, attempt) on this agent after d.
  virtual void arm_timeout(std::chrono::milliseconds d, std::uint64_t id, int attempt) = 0;
};

struct AgentState {
  std::shared_ptr<AgentCore> core;
  /// The peers are known (CAF: after rpcinit).
  bool started = false;
  std::map<std::uint64_t, OutCallPtr> pending;
  std::uint64_t next_call = 1;
  std::map<int, std::map<std::uint64_t, ReplyPtr>> done;
  std::map<int, std::deque<std::uint64_t>> done_order;
  std::map<int, std::size_t> done_bytes;
  std::set<std::pair<int, std::uint64_t>> running;
};

/// A user thread's call (post_call): sends it, or fails it when dest is gone.
void handle_out(AgentState& st, AgentLink& link, const OutCallPtr& call);
/// A request from a peer: answered from the idempotency window, dropped when
/// it runs already, else dispatched (pool, strand or built-in).
void handle_request(AgentState& st, AgentLink& link, Request&& r);
/// A call this agent ran has its reply (from a pool thread or a strand).
void handle_fin(AgentState& st, AgentLink& link, int caller, std::uint64_t id, const ReplyPtr& r);
/// The reply to one of this agent's calls.
void handle_reply(AgentState& st, AgentLink& link, std::uint64_t id, Reply r);
/// A call's deadline passed (attempt: the attempt it was armed for).
void handle_timeout(AgentState& st, AgentLink& link, std::uint64_t id, int attempt);
/// Worker r is gone: its pending calls fail, its holds and contexts go.
void handle_lost(AgentState& st, AgentLink& link, int r, const std::string& what);

}  // namespace dopt::rpc::detail
