#pragma once
// dopt::rpc: remote calls between named workers, remote references (RRef)
// and gradient contexts, on actors (torch.distributed.rpc + dist_autograd's
// context, without thread-local state). docs/rpc.md has the guide.
//
//   // every process (or simulated worker):
//   dopt::rpc::register_function("add", [](dopt::Tensor a, double b) { ... return t; });
//   dopt::Runtime rt;
//   dopt::rpc::Agent agent = dopt::rpc::init(rt, env, "trainer0");  // env: a LaunchEnv
//   dopt::Tensor t = agent.rpc_sync<dopt::Tensor>("ps0", "add", x, 2.0);
//   dopt::rpc::RRef<Model> m = agent.remote<Model>("ps0", "make_model", 16);
//   agent.shutdown();                                   // graceful: waits for everybody
//
// Workers and agents
//   * Every worker has one agent: an actor that sends and receives the calls
//     of that worker. Agent is a handle to it (copies share it). There is no
//     process-global agent: simulated workers (rpc::simulate) share one
//     process, each with its own Agent.
//   * Workers have names (unique, checked at init) and ranks 0..world_size-1;
//     every call addresses a worker by name or rank (rpc::To).
//   * Functions are registered by name, process-wide (register_function,
//     register_method): they are code, so every process registers the same
//     ones (typically at the top of main, or from a static initialiser).
//
// Calls
//   * rpc_async<R>(to, fn, args...) returns Future<R>; rpc_sync waits for it;
//     remote<T>(to, fn, args...) runs fn on `to` and keeps its result there,
//     returning an RRef<T> at once (torch's rpc.remote).
//   * Arguments and results are serialised (rpc_serialize.hpp), also between
//     simulated workers: a Tensor argument arrives as a copy.
//   * User functions never run on the agent actor: free functions run on the
//     worker's thread pool (RpcOptions::num_worker_threads threads at most;
//     they may block, e.g. make nested calls, as long as fewer than that many
//     block at once). Calls on one RRef's value (RRef::rpc_async, to_here)
//     run one at a time, in the order the owner received them: every owned
//     value has its own queue (a strand), so the value is an actor.
//   * The futures are filled on the agent actor's thread: a then()
//     continuation runs there and must not block (wait on the future from
//     your own thread instead). Only bookkeeping (reference counts, context
//     deposits, shutdown notes) runs on the agent itself.
//   * Every call has a deadline: Fn::timeout, else RpcOptions::rpc_timeout.
//     The future fails with
//       TimeoutError   no reply in time (names the function, the destination
//                      worker and the caller);
//       KeyError       the function is not registered on the destination
//                      (names the function and the worker);
//       TypeError      the arguments do not fit the function's parameters, a
//                      method called on a value of another type;
//       PeerLostError  the destination worker died (at once when the worker
//                      is already known dead), naming it and its rank;
//       StateError     this agent was shut down or killed first;
//       any dopt::Error subclass the function threw, with its type kept
//       (other exceptions arrive as dopt::Error with their what()).
//   * Idempotency: every request carries (caller rank, call id). The callee
//     remembers the last RpcOptions::dedup_window completed ids per caller
//     (fewer when their results exceed dedup_window_bytes)
//     and answers a repeated request with the cached reply without running
//     the function again; a repeat while it still runs is dropped (its reply
//     comes once). So a resend (Fn::retries) never applies an update
//     twice.
//
// RRefs (remote references)
//   * RRef<T> names a value owned by one worker (owner()); to_here() copies
//     it to the caller (T must be encodable), local_value() is the value
//     itself on the owner (StateError elsewhere), rpc_async/rpc_sync call a
//     method registered with register_method<T> on it, in its strand.
//   * Reference counting across workers: the owner counts, per worker, the
//     RRef handles that worker holds (a handle and its copies inside one
//     process count once; every RRef received in a message is a new count).
//     Sending an RRef in a message (argument or result) tells the owner the
//     receiver holds it, and the call completes only once the owner has
//     confirmed, the sender keeping its own count until then (torch's fork
//     protocol, simplified). A release may overtake the matching add (a
//     count below zero for a moment): the owner frees the value only when
//     every worker's count is zero. A worker that dies stops holding.
//
// Gradient contexts (torch's dist_autograd context, as an explicit handle)
//   * agent.new_context() makes a context with an id unique across workers.
//     ctx.deposit(rref, grad) adds grad into the context on rref's owner
//     (gradients deposited twice for one parameter are summed);
//     deposit_all batches them, one message per owner. Owners hand a
//     context's gradients to the DistributedOptimizer (context_grad()).
//   * A context lives until the last handle of its creator is destroyed or
//     release() is called: then every owner that got a deposit drops it. An
//     owner also drops the contexts of a creator that died.
//   * A remote backward deposits with attach_context(id) (a handle that does
//     not release the context).
//
// Shutdown
//   * shutdown() is graceful and collective: it waits for this worker's own
//     outstanding calls, tells every other worker it is done, waits until
//     every live worker has said the same (serving their calls meanwhile),
//     waits for the last replies, then stops the agent and frees the values
//     it owns. Dead workers count as done. Bounded by shutdown_timeout
//     (TimeoutError naming the workers that did not finish; the agent is
//     stopped anyway). Idempotent.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/runtime.hpp"
#include "dopt/actors/rpc_serialize.hpp"
#include "dopt/actors/sim.hpp"
#include "dopt/runtime/launch_env.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::rpc {

struct RpcOptions {
  /// Default deadline of every call.
  std::chrono::milliseconds rpc_timeout{std::chrono::seconds(60)};
  /// Bounds rpc::init (rendezvous and connecting).
  std::chrono::milliseconds init_timeout{std::chrono::seconds(300)};
  /// Bounds shutdown().
  std::chrono::milliseconds shutdown_timeout{std::chrono::seconds(300)};
  /// Threads that run user functions (grown on demand up to this many).
  int num_worker_threads = 16;
  /// Completed calls remembered per caller (idempotency window): at most
  /// this many ids, and older ones also go while their cached results
  /// exceed dedup_window_bytes (the newest is always kept).
  std::size_t dedup_window = 4096;
  std::size_t dedup_window_bytes = std::size_t(64) << 20;
};

struct WorkerInfo {
  std::string name;
  int rank = -1;
  bool operator==(const WorkerInfo&) const = default;
};

/// A destination: worker name or rank.
struct To {
  std::string name;
  int rank = -1;
  To(const char* n) : name(n) {}
  To(std::string n) : name(std::move(n)) {}
  To(int r) : rank(r) {}
  To(const WorkerInfo& w) : rank(w.rank) {}
};

/// Per-call settings.
struct CallOptions {
  /// The call's deadline; empty: RpcOptions::rpc_timeout.
  std::optional<std::chrono::milliseconds> timeout = std::nullopt;
  /// Resends (same call id) after a deadline passes without a reply, each
  /// with a fresh deadline, before failing with TimeoutError. The callee
  /// runs the call at most once (see Idempotency above).
  int retries = 0;
};

/// A function name plus per-call settings:
///   agent.rpc_sync<int>("ps0", "step");                                  // defaults
///   agent.rpc_sync<int>("ps0", {"step", {.timeout = 500ms, .retries = 2}});
struct Fn : CallOptions {
  std::string name;
  Fn(const char* n) : name(n) {}
  Fn(std::string n) : name(std::move(n)) {}
  Fn(std::string n, CallOptions options) : CallOptions(options), name(std::move(n)) {}
};

class Agent;
class GradContext;
/// The state behind a GradContext (opaque: defined and used by the library
/// only); the creator's handles and their copies share one.
struct ContextState;

/// Registers f under name, process-wide (a later registration of the same
/// name replaces it). f's parameters and result are deduced; the parameters
/// (after an optional leading `Agent&`: the worker it runs on) must be
/// encodable, the result too unless f is only used with remote().
template <class F>
void register_function(const std::string& name, F f);
/// Registers a method of values of type T (called through RRef<T>):
/// f(T&, args...) or f(Agent&, T&, args...). It runs in the value's strand.
template <class T, class F>
void register_method(const std::string& name, F f);
/// Whether name is registered in this process.
bool is_registered(const std::string& name);

template <class T>
class RRef {
 public:
  using value_type = T;
  RRef() = default;
  /// Made by the library (Agent::remote, make_rref, a decoded message).
  explicit RRef(std::shared_ptr<RRefState> s) : s_(std::move(s)) {}

  bool valid() const noexcept { return s_ != nullptr; }
  // The methods below throw StateError on an empty RRef (default-constructed).
  /// The owner worker.
  WorkerInfo owner() const;
  int owner_rank() const;
  /// Whether this worker owns the value.
  bool is_owner() const;
  /// The value's id (unique across workers).
  std::uint64_t id() const;

  /// A copy of the value, fetched from the owner (in the value's strand,
  /// so after every call the owner received before). T must be encodable.
  Future<T> to_here_async(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
    static_assert(encodable<T>(), "RRef::to_here needs an encodable value type");
    Fn fn("__rref.fetch");
    fn.timeout = timeout;
    return call<T>(fn);
  }
  T to_here(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
    return to_here_async(timeout).get();
  }
  /// The value itself; only on the owner (StateError elsewhere). Valid while
  /// any RRef to it lives. Waits (up to the agent's rpc_timeout, then
  /// TimeoutError) while a remote() that makes it still runs here or has not
  /// arrived yet (the RRef came by a message that got here first); not
  /// synchronised with the value's strand otherwise.
  T& local_value() const;

  /// Calls method (register_method<T>) on the value, on the owner.
  template <class R = void, class... A>
  Future<R> rpc_async(const Fn& method, const A&... args) const {
    return call<R>(method, args...);
  }
  template <class R = void, class... A>
  R rpc_sync(const Fn& method, const A&... args) const {
    return call<R>(method, args...).get();
  }

  /// The hold this handle shares (the library's; encoding an RRef sends it).
  const std::shared_ptr<RRefState>& state_ptr() const noexcept { return s_; }

 private:
  /// Sends method(args...) to the owner; the future keeps this handle.
  template <class R, class... A>
  Future<R> call(const Fn& method, const A&... args) const;
  /// *s_, or StateError naming op when empty.
  const RRefState& state(const char* op) const;
  std::shared_ptr<RRefState> s_;
};

/// A gradient context (see the top of this file). Copies share it.
class GradContext {
 public:
  GradContext() = default;
  /// Made by the library (Agent::new_context, attach_context).
  explicit GradContext(std::shared_ptr<ContextState> s) : s_(std::move(s)) {}
  bool valid() const noexcept { return s_ != nullptr; }
  std::uint64_t id() const;
  /// The rank of the worker that made it.
  int creator_rank() const;
  /// Adds grad into the context on param's owner. The future completes once
  /// the owner holds it.
  Future<void> deposit(const RRef<Tensor>& param, const Tensor& grad);
  /// Many at once: one message per owner.
  Future<void> deposit_all(const std::vector<std::pair<RRef<Tensor>, Tensor>>& grads);
  /// Completes when every deposit made through this context's handles so
  /// far completed; fails with the first failure (in the order the deposits
  /// were made: when_all).
  Future<void> deposits_done() const;
  /// Drops the context on every owner that got a deposit (idempotent).
  /// Done by the destructor of the creator's last handle.
  void release();
  bool released() const;

 private:
  std::shared_ptr<ContextState> s_;
};

class Agent {
 public:
  /// Made by rpc::init / rpc::simulate / rpc::run.
  explicit Agent(std::shared_ptr<AgentCore> core);

  const std::string& name() const;
  int rank() const;
  int world_size() const;
  /// Bytes of encoded arguments and results this worker sent to the others
  /// so far (every copy of a request, every reply; calls to itself do not
  /// count). Any thread.
  std::uint64_t bytes_sent() const;
  WorkerInfo worker_info() const;
  /// KeyError for an unknown name, ValueError for a rank out of range.
  WorkerInfo worker_info(const std::string& name) const;
  WorkerInfo worker_info(int rank) const;
  std::vector<WorkerInfo> workers() const;
  const RpcOptions& options() const;

  /// Calls fn(args...) on `to` (any thread); the future is filled on this
  /// agent's thread (see Calls at the top of this file).
  template <class R = void, class... A>
  Future<R> rpc_async(const To& to, const Fn& fn, const A&... args) const;
  template <class R = void, class... A>
  R rpc_sync(const To& to, const Fn& fn, const A&... args) const {
    return rpc_async<R>(to, fn, args...).get();
  }
  /// Runs fn(args...) on `to` and keeps the result (of type T) there. The
  /// RRef is returned at once; a failure of fn shows on the first use.
  template <class T, class... A>
  RRef<T> remote(const To& to, const Fn& fn, const A&... args) const;
  /// An RRef to a value owned by this worker (torch: RRef(value)).
  template <class T>
  RRef<T> make_rref(T value) const;

  GradContext new_context() const;
  /// A handle to an existing context (made elsewhere) that deposits into it
  /// but does not release it.
  GradContext attach_context(std::uint64_t id) const;
  /// Owner side: the gradient deposited in context ctx for the owned value
  /// obj (undefined when there is none).
  Tensor context_grad(std::uint64_t ctx, std::uint64_t obj) const;
  /// Owner side: drops the gradients of ctx for the given owned values.
  void drop_context_grads(std::uint64_t ctx, const std::vector<std::uint64_t>& objs) const;
  /// Graceful collective shutdown (see the top of this file).
  void shutdown() const;
  /// Whether the agent still runs (not shut down or killed).
  bool alive() const;
  /// Waits until this agent has seen `worker` die (its pending calls failed,
  /// its contexts and holds dropped); false after timeout. For tests and
  /// supervisors.
  bool wait_until_lost(const To& worker, std::chrono::milliseconds timeout) const;

  /// The agent's shared state (opaque; an identity for maps keyed by agent).
  const std::shared_ptr<AgentCore>& core() const noexcept { return core_; }

 private:
  std::shared_ptr<AgentCore> core_;
};

/// Remote modules (torch's RemoteModule.remote_parameters): M is a type
/// with `std::vector<Tensor> parameters()`. register_module<M>() (in every
/// process, like a function) registers the method remote_parameters calls.
template <class M>
std::string module_parameters_method() {
  return std::string("dopt.rpc.remote_parameters/") + typeid(M).name();
}
template <class M>
void register_module() {
  register_method<M>(module_parameters_method<M>(), [](Agent& a, M& m) {
    std::vector<RRef<Tensor>> out;
    for (const Tensor& p : m.parameters()) out.push_back(a.make_rref(p));
    return out;
  });
}
/// RRefs to the parameters of the module `module` holds (each one shares the
/// module's tensor: a DistributedOptimizer over them updates the module).
/// Every call makes new RRefs (new ids) to the same tensors.
template <class M>
std::vector<RRef<Tensor>> remote_parameters(const RRef<M>& module) {
  return module.template rpc_sync<std::vector<RRef<Tensor>>>(module_parameters_method<M>());
}

// The entry points take their configuration as dopt's collective ones do
// (init_process_group, simulate, run_distributed): what to join or how many
// workers first, then one options struct.

/// Real processes: joins the world that env describes (env.rank,
/// env.world_size; rank 0 listens on env.master_addr / env.master_port, see
/// rendezvous.hpp) as the worker called `name`; a collective of all
/// env.world_size processes. Names must be unique (ValueError naming the
/// ranks). Throws like rendezvous().
Agent init(Runtime& runtime, const LaunchEnv& env, const std::string& name, const RpcOptions& options = {});

struct SimulateOptions {
  /// Runtime to use; null: simulate starts (and stops) its own with `runtime_options`.
  Runtime* runtime = nullptr;
  RuntimeOptions runtime_options = RuntimeOptions::from_env();
  RpcOptions rpc;
  /// Worker names, index rank; empty: "worker0", "worker1", ...
  std::vector<std::string> names;

  /// Deterministic simulation (as dopt::simulate's, dopt/actors/sim.hpp):
  /// the workers' threads, their agents and their pool threads run one at a
  /// time, the next one chosen by a generator seeded with `seed` at every
  /// call, future wait and message an agent handles; deadlines (Fn::timeout,
  /// rpc_timeout, shutdown_timeout) are in virtual time. DOPT_SIM_SEED in the
  /// environment turns it on with its seed. No runtime is started.
  bool deterministic = false;
  std::uint64_t seed = 0;
  /// Faults (deterministic only; else ValueError). Calls are counted per
  /// worker: every rpc_async/rpc_sync/remote/RRef call and to_here its code
  /// (or a function it serves) starts; crash(w, k) kills worker w at its
  /// k-th call as if its process died (its peers see it lost), stop(w, k)
  /// freezes it (calls to it time out). Messages are the requests and
  /// replies between agents: drop_message / delay_messages.
  FaultPlan faults;
  /// When set, filled with what the run did (trace hash, faults, virtual time).
  SimReport* report = nullptr;
  /// Keep the trace's lines in `report`.
  bool keep_trace = false;
};

/// world_size simulated workers in this process, each running fn(agent) on
/// its own thread, then shutdown() (graceful). A worker whose fn throws is
/// stopped at once (its peers see it die) and simulate rethrows the first
/// exception after every worker finished (like dopt::simulate). A worker
/// crashed by a fault plan is not an error of simulate (its peers' calls
/// fail with PeerLostError). In deterministic mode a failing run prints its
/// seed to stderr ("... replay with DOPT_SIM_SEED=s").
void simulate(int world_size, const std::function<void(Agent&)>& fn, const SimulateOptions& options = {});

struct RunOptions {
  /// Workers to simulate when the process was not started by a launcher.
  int simulated_workers = 1;
  /// The name of the worker of each rank; empty: "worker<rank>".
  std::function<std::string(int)> names;
  RpcOptions rpc;
  /// Options of the runtime that run starts.
  RuntimeOptions runtime_options = RuntimeOptions::from_env();
};

/// Programs that run either way (like dopt::run_distributed): launched
/// (dopt-run, torchrun, ...) it runs fn once as this process's worker;
/// alone it simulates options.simulated_workers workers.
void run(const std::function<void(Agent&)>& fn, const RunOptions& options = {});
/// The same as run(fn, {.simulated_workers = simulated_workers}).
void run(const std::function<void(Agent&)>& fn, int simulated_workers);

/// The name of e's dopt::Error subclass ("TimeoutError", ..., "Error").
std::string error_kind(const Error& e);
/// An exception of the subclass named kind (as error_kind writes it).
std::exception_ptr make_error(const std::string& kind, const std::string& op, const std::string& what,
                              std::optional<int> rank);

}  // namespace dopt::rpc

// The code the templates above expand to, and their bodies (not an API of
// their own).
#define DOPT_RPC_CALLS_FROM_RPC_HPP
#include "dopt/actors/detail/rpc_calls.hpp"
#include "dopt/actors/detail/rpc_templates.hpp"
