#pragma once
// Internal to dopt_actors: what the RPC sources share. An agent's state
// (AgentCore) is shared by user threads, pool threads and the agent (its
// CAF actor, or in deterministic simulation its SimAgent: sim_agent.cpp).
//
// Messages between agents use only types CAF serialises itself (integers,
// strings, std::vector<char>, actor handles), so nothing has to be announced
// with add_message_type. Per call:
//   caller -> callee  (rpcreq, caller rank, call id, mode, fn, target, new object, args)
//   callee -> caller  (rpcrep, call id, status, error kind, op, detail, error rank, result)
// Messages from user threads to their own agent carry shared_ptrs (local
// only, CAF_ALLOW_UNSAFE_MESSAGE_TYPE).
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "caf/all.hpp"
#include "dopt/actors/rpc.hpp"
#include "rpc/pool.hpp"
#include "sim/sync.hpp"

namespace dopt::rpc::detail {

/// An outgoing call as its errors name it (call_text.cpp): "RRef.to_here()
/// of a value owned by worker 'ps1' (rank 1)", "DistributedOptimizer::step()
/// on worker 'ps1' (rank 1) (internally 'dopt.optim.step')", "rpc 'f' to
/// worker 'b' (rank 1)".
std::string call_text(const rpc::AgentCore& c, const CallSpec& spec, int dest);
/// A function's name as the user knows it: "RRef.to_here()" for
/// '__rref.fetch', the public call of an internal function, else "'fn'".
std::string user_call_text(const std::string& fn);

struct OutCall {
  int dest = -1;
  int attempts = 0;
  CallSpec spec;
  Promise<std::vector<char>> promise;
  ~OutCall() {
    promise.set_exception(std::make_exception_ptr(
        StateError("rpc", "call of " + user_call_text(spec.fn) + " was dropped: the calling worker's agent stopped")));
  }
};
using OutCallPtr = std::shared_ptr<OutCall>;

struct Reply {
  int status = 0;  // 0 ok, 1 error
  std::string kind, op, detail;
  int err_rank = -1;
  std::vector<char> bytes;
};
using ReplyPtr = std::shared_ptr<const Reply>;

struct AgentPeers {
  std::vector<caf::actor> actors;
};
using AgentPeersPtr = std::shared_ptr<const AgentPeers>;

}  // namespace dopt::rpc::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::rpc::detail::OutCallPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::rpc::detail::ReplyPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dopt::rpc::detail::AgentPeersPtr)

namespace dopt::rpc::detail {

struct Object {
  std::uint64_t id = 0;
  ObjectValue v;
  bool creation_seen = false;  // remote() request received / made here
  bool created = false;        // value there, or creation failed (error)
  std::exception_ptr error;
  std::map<int, long> counts;  // worker -> holds
  // strand
  std::mutex m;
  std::deque<std::function<void()>> q;
  bool busy = true;  // blocked until created
};
using ObjectPtr = std::shared_ptr<Object>;

class SimAgent;
// --- sim_agent.cpp: the agent's link in deterministic simulation ---
void sim_send_out(SimAgent& a, OutCallPtr call);
void sim_send_fin(SimAgent& a, int caller, std::uint64_t id, ReplyPtr r);
void sim_stop(SimAgent& a, bool kill);

}  // namespace dopt::rpc::detail

namespace dopt::rpc {

/// An agent's state (rpc_serialize.hpp declares it; see the top of this file).
struct AgentCore : std::enable_shared_from_this<AgentCore> {
  std::string name;
  int rank = 0;
  int world = 1;
  std::vector<std::string> names;
  RpcOptions options;
  caf::actor_system* sys = nullptr;

  mutable std::mutex mutex;
  caf::actor actor;
  std::shared_ptr<detail::SimAgent> sim;  // deterministic simulation: the agent instead of `actor`
  bool stopped = false;
  bool killed = false;
  std::atomic<bool> shutting_down{false};
  std::unique_ptr<detail::Pool> pool;

  std::mutex obj_mutex;
  std::condition_variable obj_cv;  // an object was created
  std::map<std::uint64_t, detail::ObjectPtr> objects;
  std::set<std::uint64_t> freed;
  std::atomic<std::uint64_t> next_object{1};
  std::atomic<std::uint64_t> next_context{1};
  /// Bytes of encoded arguments and results this agent sent to other
  /// workers (Agent::bytes_sent): requests (every copy) and replies.
  std::atomic<std::uint64_t> bytes_sent{0};

  std::mutex ctx_mutex;
  std::map<std::uint64_t, std::map<std::uint64_t, Tensor>> contexts;

  std::mutex st_mutex;
  std::condition_variable st_cv;
  long outstanding = 0;
  std::set<int> bye_from;
  std::set<int> lost;

  std::shared_ptr<void> keep;  // real processes: the rendezvous

  caf::actor handle() const {
    std::lock_guard<std::mutex> lock(mutex);
    return actor;
  }
  /// The agent runs (not stopped).
  bool running() const {
    std::lock_guard<std::mutex> lock(mutex);
    return !stopped && (actor || sim);
  }
  /// The agent's link (its actor, or its SimAgent in deterministic mode);
  /// false once it stopped.
  bool link(caf::actor& a, std::shared_ptr<detail::SimAgent>& s) const {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopped) return false;
    a = actor;
    s = sim;
    return true;
  }
  /// To the agent: a user thread's call (false: the agent stopped).
  bool send_out(detail::OutCallPtr call) {
    caf::actor a;
    std::shared_ptr<detail::SimAgent> s;
    if (!link(a, s)) return false;
    if (s)
      detail::sim_send_out(*s, std::move(call));
    else if (a)
      caf::anon_send(a, caf::atom("rpcout"), std::move(call));
    else
      return false;
    return true;
  }
  /// To the agent: the reply of a call it ran (from a pool thread or a strand).
  void send_fin(int caller, std::uint64_t id, detail::ReplyPtr r) {
    caf::actor a;
    std::shared_ptr<detail::SimAgent> s;
    if (!link(a, s)) return;
    if (s)
      detail::sim_send_fin(*s, caller, id, std::move(r));
    else if (a)
      caf::anon_send(a, caf::atom("rpcfin"), caller, id, std::move(r));
  }
  std::string who(int r) const {
    return "worker '" + (r >= 0 && r < world ? names[static_cast<std::size_t>(r)] : std::string("?")) + "' (rank " +
           std::to_string(r) + ")";
  }
  bool is_lost(int r) {
    std::lock_guard<std::mutex> lock(st_mutex);
    return lost.count(r) > 0;
  }

  // objects (callers hold no lock)
  detail::ObjectPtr get_or_placeholder_locked(std::uint64_t id) {
    auto& o = objects[id];
    if (!o) {
      o = std::make_shared<detail::Object>();
      o->id = id;
    }
    return o;
  }
  /// Removes obj when nobody holds it; returns it (to drop outside the lock).
  detail::ObjectPtr maybe_free_locked(const detail::ObjectPtr& o) {
    if (!o->creation_seen || !o->created) return nullptr;
    for (auto& [w, c] : o->counts)
      if (c != 0) return nullptr;
    auto it = objects.find(o->id);
    if (it == objects.end() || it->second != o) return nullptr;
    detail::ObjectPtr out = it->second;
    objects.erase(it);
    freed.insert(o->id);
    return out;
  }
  void count(std::uint64_t id, int holder, long delta) {
    // A lost worker holds nothing (drop_worker): a hold handed on to it after
    // its loss was seen (an RRef in the reply to a call it made before it
    // died) would keep the value forever.
    if (delta > 0 && is_lost(holder)) return;
    detail::ObjectPtr drop;
    {
      std::lock_guard<std::mutex> lock(obj_mutex);
      if (freed.count(id)) return;
      auto o = get_or_placeholder_locked(id);
      if ((o->counts[holder] += delta) == 0) o->counts.erase(holder);
      drop = maybe_free_locked(o);
    }
    if (drop) release_object(drop);
  }
  static void release_object(detail::ObjectPtr& o) {
    // The value goes when the last running task on it ends.
    std::lock_guard<std::mutex> lock(o->m);
    o->q.clear();
  }
  void drop_worker(int r) {
    std::vector<detail::ObjectPtr> drops;
    {
      std::lock_guard<std::mutex> lock(obj_mutex);
      std::vector<detail::ObjectPtr> all;
      for (auto& [id, o] : objects) all.push_back(o);
      for (auto& o : all) {
        o->counts.erase(r);
        if (auto d = maybe_free_locked(o)) drops.push_back(d);
      }
    }
    for (auto& d : drops) release_object(d);
    std::lock_guard<std::mutex> lock(ctx_mutex);
    for (auto it = contexts.begin(); it != contexts.end();)
      it = static_cast<int>(it->first >> 48) == r ? contexts.erase(it) : std::next(it);
  }

  // strands
  void strand_post(const detail::ObjectPtr& o, std::function<void()> task) {
    std::lock_guard<std::mutex> lock(o->m);
    o->q.push_back(std::move(task));
    if (!o->busy) {
      o->busy = true;
      pool->post([self = shared_from_this(), o] { self->drain(o); });
    }
  }
  void strand_open(const detail::ObjectPtr& o) {
    std::lock_guard<std::mutex> lock(o->m);
    if (o->q.empty())
      o->busy = false;
    else
      pool->post([self = shared_from_this(), o] { self->drain(o); });
  }
  void drain(const detail::ObjectPtr& o) {
    for (;;) {
      std::function<void()> task;
      {
        std::lock_guard<std::mutex> lock(o->m);
        if (o->q.empty()) {
          o->busy = false;
          return;
        }
        task = std::move(o->q.front());
        o->q.pop_front();
      }
      task();
    }
  }

  void stop(bool kill) {
    caf::actor a;
    std::shared_ptr<detail::SimAgent> s;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopped) return;
      stopped = true;
      killed = kill;
      a = actor;
      actor = nullptr;
      s = std::move(sim);  // the SimAgent holds this core: no cycle once stopped
    }
    if (a) caf::anon_send_exit(a, kill ? caf::exit_reason::kill : caf::exit_reason::user_shutdown);
    if (s) detail::sim_stop(*s, kill);
    if (kill)
      pool->stop();
    else
      pool->join();
    std::map<std::uint64_t, detail::ObjectPtr> objs;
    {
      std::lock_guard<std::mutex> lock(obj_mutex);
      objs.swap(objects);
    }
    for (auto& [id, o] : objs) release_object(o);
    objs.clear();
    {
      std::lock_guard<std::mutex> lock(ctx_mutex);
      contexts.clear();
    }
    keep.reset();
    st_cv.notify_all();
    obj_cv.notify_all();
  }
};

}  // namespace dopt::rpc

namespace dopt::rpc::detail {

// --- registry.cpp ---
/// The registered function called `name`, or null.
std::shared_ptr<const FunctionEntry> find_function(const std::string& name);


// --- calls.cpp ---
/// Posts one call to the agent (send_call without handing RRefs on).
Future<std::vector<char>> post_call(const std::shared_ptr<AgentCore>& core, CallSpec spec);
/// Tells the owners of the RRefs in a message that `to` holds them now; each
/// future completes once its owner confirmed (the sender holds the RRef
/// until then).
std::vector<Future<std::vector<char>>> hand_on_all(const std::shared_ptr<AgentCore>& core,
                                                   const std::vector<std::shared_ptr<RRefState>>& rrefs, int to);

// --- builtins.cpp: calls that run on the agent actor itself ---
using Builtin = std::function<void(AgentCore&, int caller, Decoder&)>;
const std::map<std::string, Builtin>& builtins();

// --- agent_actor.cpp ---
/// A core with its (not yet started) agent actor.
std::shared_ptr<AgentCore> make_core(caf::actor_system& sys, const std::string& name, int rank, int world,
                                     const RpcOptions& options);
/// Gives the agent its peers (index: rank) and waits until it has them.
void start_agent(caf::actor_system& sys, const std::shared_ptr<AgentCore>& core, std::vector<caf::actor> peers);
/// A core without an agent (checks the options).
std::shared_ptr<AgentCore> new_core(const std::string& name, int rank, int world, const RpcOptions& options);

// --- sim_agent.cpp ---
/// Deterministic simulation: gives every core a SimAgent (their peers: each other).
void make_sim_agents(const std::vector<std::shared_ptr<AgentCore>>& cores);
/// On the worker's rank task: starts its agent's task.
void start_sim_agent(AgentCore& core);
/// The calling thread runs an agent's handlers (deterministic simulation).
bool in_sim_agent() noexcept;

}  // namespace dopt::rpc::detail
