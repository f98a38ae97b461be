// dopt::rpc (rpc.hpp): the agent actor of every worker, the function
// registry, RRef counting, gradient contexts, and the start of simulated and
// real workers.
//
// Messages between agents use only types CAF serialises itself (integers,
// strings, std::vector<char>, actor handles), so nothing has to be announced
// with add_message_type. Per call:
//   caller -> callee  (rpcreq, caller rank, call id, mode, fn, target, new object, args)
//   callee -> caller  (rpcrep, call id, status, error kind, op, detail, error rank, result)
// Messages from user threads to their own agent carry shared_ptrs (local
// only, CAF_ALLOW_UNSAFE_MESSAGE_TYPE).
#include "dopt/actors/rpc.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf_thread.hpp"
#include "internal.hpp"
#include "rendezvous_internal.hpp"
#include "world_setup.hpp"

namespace dopt::rpc::detail {

struct OutCall {
  int dest = -1;
  int attempts = 0;
  CallSpec spec;
  Promise<std::vector<char>> promise;
  ~OutCall() {
    promise.set_exception(std::make_exception_ptr(
        StateError("rpc", "call of '" + spec.fn + "' was dropped: the calling worker's agent stopped")));
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

namespace dopt::rpc {

using namespace std::chrono;

// --- errors ---------------------------------------------------------------------------

std::string error_kind(const Error& e) {
#define DOPT_KIND(T) \
  if (dynamic_cast<const T*>(&e)) return #T;
  DOPT_KIND(PeerLostError)
  DOPT_KIND(CollectiveMismatchError)
  DOPT_KIND(TimeoutError)
  DOPT_KIND(NotSupportedError)
  DOPT_KIND(IOError)
  DOPT_KIND(StateDictError)
  DOPT_KIND(StateError)
  DOPT_KIND(DeviceError)
  DOPT_KIND(DTypeError)
  DOPT_KIND(ShapeError)
  DOPT_KIND(KeyError)
  DOPT_KIND(TypeError)
  DOPT_KIND(ValueError)
#undef DOPT_KIND
  return "Error";
}

std::exception_ptr make_error(const std::string& kind, const std::string& op, const std::string& what,
                              std::optional<int> rank) {
#define DOPT_MAKE(T) \
  if (kind == #T) return std::make_exception_ptr(T(op, what, rank));
  DOPT_MAKE(PeerLostError)
  DOPT_MAKE(CollectiveMismatchError)
  DOPT_MAKE(TimeoutError)
  DOPT_MAKE(NotSupportedError)
  DOPT_MAKE(IOError)
  DOPT_MAKE(StateDictError)
  DOPT_MAKE(StateError)
  DOPT_MAKE(DeviceError)
  DOPT_MAKE(DTypeError)
  DOPT_MAKE(ShapeError)
  DOPT_MAKE(KeyError)
  DOPT_MAKE(TypeError)
  DOPT_MAKE(ValueError)
#undef DOPT_MAKE
  return std::make_exception_ptr(Error(op, what, rank));
}

// --- tensors on the wire ------------------------------------------------------------------

void write_tensor(Encoder& e, const Tensor& t) {
  e.put_tag(tag::tensor);
  e.put_pod<std::uint8_t>(t.defined() ? 1 : 0);
  if (!t.defined()) return;
  const Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  e.put_pod<std::uint8_t>(static_cast<std::uint8_t>(c.dtype()));
  e.put_pod<std::uint64_t>(c.shape().size());
  for (auto d : c.shape()) e.put_pod<std::int64_t>(d);
  e.put_pod<std::uint64_t>(c.nbytes());
  if (c.nbytes()) e.put_raw(c.data_ptr(), c.nbytes());
}

void read_tensor(Decoder& d, Tensor& t) {
  d.expect_tag(tag::tensor, "Tensor");
  if (!d.get_pod<std::uint8_t>()) {
    t = Tensor();
    return;
  }
  const auto dt = d.get_pod<std::uint8_t>();
  if (dt > static_cast<std::uint8_t>(DType::bool_)) d.fail("unknown dtype code " + std::to_string(dt));
  const auto nd = d.get_pod<std::uint64_t>();
  if (nd > 64) d.fail("a tensor of " + std::to_string(nd) + " dimensions");
  Shape shape(nd);
  for (auto& x : shape) x = d.get_pod<std::int64_t>();
  const auto nbytes = d.get_pod<std::uint64_t>();
  const DType dtype = static_cast<DType>(dt);
  if (nbytes != static_cast<std::uint64_t>(shape_numel(shape)) * itemsize(dtype))
    d.fail("tensor bytes do not match its shape " + shape_str(shape));
  t = Tensor::empty(shape, dtype);
  if (nbytes) d.get_raw(t.data_ptr(), nbytes);
}

namespace detail {

// --- the function registry (process-wide) -------------------------------------------------

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::shared_ptr<const FunctionEntry>>& registry() {
  static std::map<std::string, std::shared_ptr<const FunctionEntry>> r;
  return r;
}
std::shared_ptr<const FunctionEntry> find_function(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}
}  // namespace

void register_entry(const std::string& name, FunctionEntry entry) {
  if (name.empty()) throw ValueError("rpc.register_function", "the name is empty");
  if (name.rfind("__", 0) == 0)
    throw ValueError("rpc.register_function", "names starting with '__' are reserved, got '" + name + "'");
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = std::make_shared<const FunctionEntry>(std::move(entry));
}

// --- a growing thread pool ------------------------------------------------------------------

class Pool {
 public:
  explicit Pool(int max_threads) : s_(std::make_shared<S>()) { s_->max = std::max(1, max_threads); }
  ~Pool() { join(); }
  void post(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(s_->m);
    if (s_->stop) return;
    s_->q.push_back(std::move(f));
    if (static_cast<int>(s_->q.size()) > s_->idle && static_cast<int>(s_->threads.size()) < s_->max)
      s_->threads.emplace_back([s = s_] { loop(s); });
    else
      s_->cv.notify_one();
  }
  /// Stops taking tasks; queued ones are dropped; running ones finish.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(s_->m);
      s_->stop = true;
      s_->q.clear();
    }
    s_->cv.notify_all();
  }
  void join() {
    stop();
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> lock(s_->m);
      ts.swap(s_->threads);
    }
    for (auto& t : ts) {
      if (t.get_id() == std::this_thread::get_id())
        t.detach();
      else if (t.joinable())
        t.join();
    }
  }

 private:
  struct S {
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    std::vector<std::thread> threads;
    int idle = 0;
    int max = 1;
    bool stop = false;
  };
  static void loop(std::shared_ptr<S> s) {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(s->m);
        ++s->idle;
        s->cv.wait(lock, [&] { return s->stop || !s->q.empty(); });
        --s->idle;
        if (s->stop) return;
        f = std::move(s->q.front());
        s->q.pop_front();
      }
      try {
        f();
      } catch (...) {
      }
    }
  }
  std::shared_ptr<S> s_;
};

// --- the core: what user threads, pool threads and the agent actor share -----------------

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

struct AgentCore : std::enable_shared_from_this<AgentCore> {
  std::string name;
  int rank = 0;
  int world = 1;
  std::vector<std::string> names;
  RpcOptions options;
  caf::actor_system* sys = nullptr;

  mutable std::mutex mutex;
  caf::actor actor;
  bool stopped = false;
  bool killed = false;
  std::atomic<bool> shutting_down{false};
  std::unique_ptr<Pool> pool;

  std::mutex obj_mutex;
  std::condition_variable obj_cv;  // an object was created
  std::map<std::uint64_t, ObjectPtr> objects;
  std::set<std::uint64_t> freed;
  std::atomic<std::uint64_t> next_object{1};
  std::atomic<std::uint64_t> next_context{1};

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
  std::string who(int r) const {
    return "worker '" + (r >= 0 && r < world ? names[static_cast<std::size_t>(r)] : std::string("?")) + "' (rank " +
           std::to_string(r) + ")";
  }
  bool is_lost(int r) {
    std::lock_guard<std::mutex> lock(st_mutex);
    return lost.count(r) > 0;
  }

  // objects (callers hold no lock)
  ObjectPtr get_or_placeholder_locked(std::uint64_t id) {
    auto& o = objects[id];
    if (!o) {
      o = std::make_shared<Object>();
      o->id = id;
    }
    return o;
  }
  /// Removes obj when nobody holds it; returns it (to drop outside the lock).
  ObjectPtr maybe_free_locked(const ObjectPtr& o) {
    if (!o->creation_seen || !o->created) return nullptr;
    for (auto& [w, c] : o->counts)
      if (c != 0) return nullptr;
    auto it = objects.find(o->id);
    if (it == objects.end() || it->second != o) return nullptr;
    ObjectPtr out = it->second;
    objects.erase(it);
    freed.insert(o->id);
    return out;
  }
  void count(std::uint64_t id, int holder, long delta) {
    ObjectPtr drop;
    {
      std::lock_guard<std::mutex> lock(obj_mutex);
      if (freed.count(id)) return;
      auto o = get_or_placeholder_locked(id);
      if ((o->counts[holder] += delta) == 0) o->counts.erase(holder);
      drop = maybe_free_locked(o);
    }
    if (drop) release_object(drop);
  }
  static void release_object(ObjectPtr& o) {
    // The value goes when the last running task on it ends.
    std::lock_guard<std::mutex> lock(o->m);
    o->q.clear();
  }
  void drop_worker(int r) {
    std::vector<ObjectPtr> drops;
    {
      std::lock_guard<std::mutex> lock(obj_mutex);
      std::vector<ObjectPtr> all;
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
  void strand_post(const ObjectPtr& o, std::function<void()> task) {
    std::lock_guard<std::mutex> lock(o->m);
    o->q.push_back(std::move(task));
    if (!o->busy) {
      o->busy = true;
      pool->post([self = shared_from_this(), o] { self->drain(o); });
    }
  }
  void strand_open(const ObjectPtr& o) {
    std::lock_guard<std::mutex> lock(o->m);
    if (o->q.empty())
      o->busy = false;
    else
      pool->post([self = shared_from_this(), o] { self->drain(o); });
  }
  void drain(const ObjectPtr& o) {
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
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopped) return;
      stopped = true;
      killed = kill;
      a = actor;
      actor = nullptr;
    }
    if (a) caf::anon_send_exit(a, kill ? caf::exit_reason::kill : caf::exit_reason::user_shutdown);
    if (kill)
      pool->stop();
    else
      pool->join();
    std::map<std::uint64_t, ObjectPtr> objs;
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

int core_rank(const AgentCore& core) { return core.rank; }
WorkerInfo core_worker(const AgentCore& core, int rank) {
  if (rank < 0 || rank >= core.world)
    throw ValueError("rpc", "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(core.world) + ")",
                     core.rank);
  return WorkerInfo{core.names[static_cast<std::size_t>(rank)], rank};
}

int resolve_rank(const AgentCore& core, const To& to, const char* op) {
  if (to.rank >= 0 || to.name.empty()) {
    if (to.rank < 0 || to.rank >= core.world)
      throw ValueError(op, "worker rank " + std::to_string(to.rank) + " is outside [0, " + std::to_string(core.world) +
                               ")", core.rank);
    return to.rank;
  }
  for (int r = 0; r < core.world; ++r)
    if (core.names[static_cast<std::size_t>(r)] == to.name) return r;
  std::string known;
  for (auto& n : core.names) known += (known.empty() ? "" : ", ") + n;
  throw KeyError(op, "unknown worker '" + to.name + "' (workers: " + known + ")", core.rank);
}

std::uint64_t new_object_id(AgentCore& core) {
  return (static_cast<std::uint64_t>(core.rank) << 48) | core.next_object.fetch_add(1);
}

Future<std::vector<char>> post_call(const std::shared_ptr<AgentCore>& core, CallSpec spec);

/// Tells the owners of the RRefs in a message that `to` holds them now; each
/// future completes once its owner confirmed (the sender holds the RRef
/// until then).
std::vector<Future<std::vector<char>>> hand_on_all(const std::shared_ptr<AgentCore>& core,
                                                   const std::vector<std::shared_ptr<RRefState>>& rrefs, int to) {
  std::vector<Future<std::vector<char>>> out;
  for (const auto& s : rrefs) {
    auto f = post_call(core, make_spec(To(s->owner), Fn("__rref.add"), Mode::call, s->id, to));
    out.push_back(f.then([s](const Future<std::vector<char>>&) { return std::vector<char>(); }));
  }
  return out;
}

Future<std::vector<char>> send_call(const std::shared_ptr<AgentCore>& core, CallSpec spec) {
  if (spec.rrefs.empty()) return post_call(core, std::move(spec));
  int dest;
  try {
    dest = resolve_rank(*core, spec.to, ("rpc '" + spec.fn + "'").c_str());
  } catch (...) {
    return make_failed_future<std::vector<char>>(std::current_exception());
  }
  auto adds = hand_on_all(core, spec.rrefs, dest);
  auto main = post_call(core, std::move(spec));
  // The call completes once its reply came and every owner counted the
  // receiver (so a caller that drops its RRef right after is not the last).
  struct Join {
    std::mutex m;
    std::size_t left;
    Promise<std::vector<char>> p;
  };
  auto j = std::make_shared<Join>();
  j->left = adds.size();
  auto result = j->p.get_future();
  auto done_one = [j, main](const Future<std::vector<char>>&) {
    bool last;
    {
      std::lock_guard<std::mutex> lock(j->m);
      last = --j->left == 0;
    }
    if (last)
      (void)main.then([j](const Future<std::vector<char>>& f) {
        if (auto e = f.exception())
          j->p.set_exception(e);
        else
          j->p.set_value(f.get());
      });
  };
  for (auto& a : adds) (void)a.then(done_one);
  return result;
}

Future<std::vector<char>> post_call(const std::shared_ptr<AgentCore>& core, CallSpec spec) {
  auto call = std::make_shared<OutCall>();
  auto fut = call->promise.get_future();
  try {
    call->dest = resolve_rank(*core, spec.to, ("rpc '" + spec.fn + "'").c_str());
  } catch (...) {
    call->promise.set_exception(std::current_exception());
    return fut;
  }
  call->spec = std::move(spec);
  caf::actor a = core->handle();
  if (!a) {
    call->promise.set_exception(std::make_exception_ptr(
        StateError("rpc", "call of '" + call->spec.fn + "': " + core->who(core->rank) + " is shut down", core->rank)));
    return fut;
  }
  {
    std::lock_guard<std::mutex> lock(core->st_mutex);
    ++core->outstanding;
  }
  std::weak_ptr<AgentCore> weak = core;
  (void)fut.then([weak](const Future<std::vector<char>>&) {
    if (auto c = weak.lock()) {
      {
        std::lock_guard<std::mutex> lock(c->st_mutex);
        --c->outstanding;
      }
      c->st_cv.notify_all();
    }
  });
  caf::anon_send(a, caf::atom("rpcout"), OutCallPtr(std::move(call)));
  return fut;
}

RRefState::~RRefState() {
  if (!core) return;
  try {
    // Release this worker's hold (fire and forget; counted for shutdown).
    (void)send_call(core, make_spec(To(owner), Fn("__rref.del"), Mode::call, id, core->rank));
  } catch (...) {
  }
}

std::shared_ptr<RRefState> adopt_rref(const std::shared_ptr<AgentCore>& core, int owner, std::uint64_t id,
                                      const std::string& type) {
  auto s = std::make_shared<RRefState>();
  s->core = core;
  s->owner = owner;
  s->id = id;
  s->type = type;
  return s;
}
std::shared_ptr<RRefState> created_rref(const std::shared_ptr<AgentCore>& core, int owner, std::uint64_t id,
                                        const std::string& type) {
  return adopt_rref(core, owner, id, type);
}

std::shared_ptr<RRefState> own_value(const std::shared_ptr<AgentCore>& core, ObjectValue v) {
  const std::uint64_t id = new_object_id(*core);
  const std::string type = v.type;
  {
    std::lock_guard<std::mutex> lock(core->obj_mutex);
    auto o = core->get_or_placeholder_locked(id);
    o->v = std::move(v);
    o->creation_seen = true;
    o->created = true;
    o->counts[core->rank] += 1;
    o->busy = false;
  }
  return adopt_rref(core, core->rank, id, type);
}

void* local_object(AgentCore& core, std::uint64_t id, const std::string& type, const char* op) {
  std::unique_lock<std::mutex> lock(core.obj_mutex);
  auto it = core.objects.find(id);
  if (it == core.objects.end())
    throw StateError(op, "the value is not owned by " + core.who(core.rank) + " (or was freed)", core.rank);
  ObjectPtr keep = it->second;
  auto& o = *keep;
  // A remote() still running here (e.g. a parameter made just before): wait for it.
  if (!core.obj_cv.wait_for(lock, core.options.rpc_timeout, [&] { return o.created || core.stopped; }))
    throw TimeoutError(op, "the value is still being created after " + std::to_string(core.options.rpc_timeout.count()) +
                               " ms", core.rank);
  if (!o.created) throw StateError(op, "the agent stopped", core.rank);
  if (o.error) std::rethrow_exception(o.error);
  if (o.v.type != type)
    throw TypeError(op, "the value has type " + readable_type_name(o.v.type) + ", not " + readable_type_name(type),
                    core.rank);
  return o.v.value.get();
}

namespace {

std::shared_ptr<Reply> error_reply(const std::exception_ptr& e, const AgentCore& core, const std::string& fn,
                                   bool user) {
  auto r = std::make_shared<Reply>();
  r->status = 1;
  const std::string where = " (raised by '" + fn + "' on " + core.who(core.rank) + ")";
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    r->kind = error_kind(err);
    r->op = err.op();
    r->detail = user ? err.detail() + where : err.detail();
    r->err_rank = err.rank() ? *err.rank() : core.rank;
  } catch (const std::exception& ex) {
    r->kind = "Error";
    r->op = "rpc";
    r->detail = std::string(ex.what()) + where;
    r->err_rank = core.rank;
  } catch (...) {
    r->kind = "Error";
    r->op = "rpc";
    r->detail = "a non-standard exception" + where;
    r->err_rank = core.rank;
  }
  return r;
}


void post_fin(const std::shared_ptr<AgentCore>& core, int caller, std::uint64_t id, ReplyPtr r) {
  if (caf::actor a = core->handle()) caf::anon_send(a, caf::atom("rpcfin"), caller, id, std::move(r));
}

/// Runs a user function or method; the reply, with RRefs handed on to the caller.
ReplyPtr run_entry(const std::shared_ptr<AgentCore>& core, int caller, const std::string& fn,
                   const std::function<void(Agent&, Decoder&, Encoder&)>& body, const std::vector<char>& args) {
  try {
    Agent agent(core);
    Decoder d(args, core, "arguments of '" + fn + "'");
    Encoder out;
    body(agent, d, out);
    // Reply only once the owners counted the caller (see send_call).
    for (auto& f : hand_on_all(core, out.rrefs, caller)) f.wait();
    auto r = std::make_shared<Reply>();
    r->bytes = out.take();
    return r;
  } catch (...) {
    return error_reply(std::current_exception(), *core, fn, true);
  }
}

// --- builtins: run on the agent actor itself -------------------------------------------------

using Builtin = std::function<void(AgentCore&, int caller, Decoder&)>;

template <class... A>
std::tuple<A...> builtin_args(Decoder& d) {
  std::tuple<A...> t;
  read(d, t);
  return t;
}

Tensor summed(const Tensor& a, const Tensor& b) {
  check_same_shape(a, b, "GradContext.deposit");
  check_same_dtype(a, b, "GradContext.deposit");
  Tensor out = a.clone();
  const auto n = out.numel();
  if (out.dtype() == DType::float32) {
    float* o = out.data<float>();
    const float* x = b.data<float>();
    for (std::int64_t i = 0; i < n; ++i) o[i] += x[i];
  } else if (out.dtype() == DType::float64) {
    double* o = out.data<double>();
    const double* x = b.data<double>();
    for (std::int64_t i = 0; i < n; ++i) o[i] += x[i];
  } else {
    throw NotSupportedError("GradContext.deposit", "summing two gradients of dtype " +
                                                       std::string(dtype_name(out.dtype())) +
                                                       " for one parameter (float32 and float64 only)");
  }
  return out;
}

const std::map<std::string, Builtin>& builtins() {
  static const std::map<std::string, Builtin> b{
      {"__rref.add",
       [](AgentCore& c, int, Decoder& d) {
         auto [id, holder] = builtin_args<std::uint64_t, int>(d);
         c.count(id, holder, +1);
       }},
      {"__rref.del",
       [](AgentCore& c, int, Decoder& d) {
         auto [id, holder] = builtin_args<std::uint64_t, int>(d);
         c.count(id, holder, -1);
       }},
      {"__ctx.deposit",
       [](AgentCore& c, int, Decoder& d) {
         auto [ctx, grads] = builtin_args<std::uint64_t, std::vector<std::pair<std::uint64_t, Tensor>>>(d);
         {
           std::lock_guard<std::mutex> lock(c.obj_mutex);
           for (auto& [obj, g] : grads)
             if (!c.objects.count(obj))
               throw KeyError("GradContext.deposit", "value " + std::to_string(obj) + " is not owned by " +
                                                         c.who(c.rank) + " (freed?)", c.rank);
         }
         std::lock_guard<std::mutex> lock(c.ctx_mutex);
         auto& m = c.contexts[ctx];
         for (auto& [obj, g] : grads) {
           if (!g.defined()) continue;
           auto it = m.find(obj);
           if (it == m.end())
             m.emplace(obj, g);
           else
             it->second = summed(it->second, g);
         }
       }},
      {"__ctx.release",
       [](AgentCore& c, int, Decoder& d) {
         auto [ctx] = builtin_args<std::uint64_t>(d);
         std::lock_guard<std::mutex> lock(c.ctx_mutex);
         c.contexts.erase(ctx);
       }},
      {"__bye",
       [](AgentCore& c, int caller, Decoder&) {
         {
           std::lock_guard<std::mutex> lock(c.st_mutex);
           c.bye_from.insert(caller);
         }
         c.st_cv.notify_all();
       }},
  };
  return b;
}

// --- the agent actor ---------------------------------------------------------------------------

struct AgentState {
  std::shared_ptr<AgentCore> core;
  std::vector<caf::actor> peers;
  std::map<std::uint64_t, OutCallPtr> pending;
  std::uint64_t next_call = 1;
  std::map<int, std::map<std::uint64_t, ReplyPtr>> done;
  std::map<int, std::deque<std::uint64_t>> done_order;
  std::map<int, std::size_t> done_bytes;
  std::set<std::pair<int, std::uint64_t>> running;
  static const char* name;
};
const char* AgentState::name = "dopt.rpc.agent";

using Self = caf::stateful_actor<AgentState>;

void fail_call(const OutCallPtr& c, std::exception_ptr e) { c->promise.set_exception(std::move(e)); }

void send_reply(Self* self, int caller, std::uint64_t id, const ReplyPtr& r) {
  auto& st = self->state;
  if (caller < 0 || caller >= static_cast<int>(st.peers.size())) return;
  self->send(st.peers[static_cast<std::size_t>(caller)], caf::atom("rpcrep"), id, r->status, r->kind, r->op,
             r->detail, r->err_rank, r->bytes);
}

void finish(Self* self, int caller, std::uint64_t id, ReplyPtr r) {
  auto& st = self->state;
  st.running.erase({caller, id});
  st.done[caller][id] = r;
  auto& order = st.done_order[caller];
  auto& bytes = st.done_bytes[caller];
  order.push_back(id);
  bytes += r->bytes.size();
  // The window: dedup_window ids or dedup_window_bytes of results, whichever is less.
  while (order.size() > std::max<std::size_t>(1, st.core->options.dedup_window) ||
         (order.size() > 1 && bytes > st.core->options.dedup_window_bytes)) {
    auto& m = st.done[caller];
    if (auto it = m.find(order.front()); it != m.end()) {
      bytes -= it->second->bytes.size();
      m.erase(it);
    }
    order.pop_front();
  }
  send_reply(self, caller, id, r);
}

void dispatch(Self* self, int caller, std::uint64_t id, int mode, const std::string& fn, std::uint64_t target,
              std::uint64_t newobj, std::vector<char> args) {
  auto core = self->state.core;
  auto& c = *core;
  auto error = [&](std::exception_ptr e) { finish(self, caller, id, error_reply(e, c, fn, false)); };
  if (static_cast<Mode>(mode) == Mode::call) {
    if (auto b = builtins().find(fn); b != builtins().end()) {
      try {
        Decoder d(args, core, "arguments of '" + fn + "'");
        b->second(c, caller, d);
        finish(self, caller, id, std::make_shared<Reply>());
      } catch (...) {
        error(std::current_exception());
      }
      return;
    }
    auto entry = find_function(fn);
    if (!entry)
      return error(std::make_exception_ptr(KeyError(
          "rpc", "unknown function '" + fn + "' on " + c.who(c.rank) + " (not registered in that process)", c.rank)));
    if (!entry->target_type.empty())
      return error(std::make_exception_ptr(TypeError(
          "rpc", "'" + fn + "' is a method (register_method); call it through an RRef", c.rank)));
    c.pool->post([core, caller, id, fn, entry, args = std::move(args)] {
      auto r = run_entry(core, caller, fn,
                         [&](Agent& a, Decoder& d, Encoder& out) { entry->call(a, nullptr, d, out); }, args);
      post_fin(core, caller, id, std::move(r));
    });
    return;
  }
  if (static_cast<Mode>(mode) == Mode::remote) {
    ObjectPtr obj;
    {
      std::lock_guard<std::mutex> lock(c.obj_mutex);
      obj = c.get_or_placeholder_locked(newobj);
      obj->creation_seen = true;
      if ((obj->counts[caller] += 1) == 0) obj->counts.erase(caller);
    }
    auto entry = find_function(fn);
    std::exception_ptr bad;
    if (!entry)
      bad = std::make_exception_ptr(KeyError(
          "rpc", "unknown function '" + fn + "' on " + c.who(c.rank) + " (not registered in that process)", c.rank));
    else if (!entry->make_object)
      bad = std::make_exception_ptr(
          TypeError("rpc", "'" + fn + "' has no result to keep (remote() needs a function that returns a value)",
                    c.rank));
    auto created = [core, obj](std::exception_ptr e, ObjectValue v) {
      ObjectPtr drop;
      {
        std::lock_guard<std::mutex> lock(core->obj_mutex);
        obj->v = std::move(v);
        obj->error = std::move(e);
        obj->created = true;
        drop = core->maybe_free_locked(obj);
      }
      core->obj_cv.notify_all();
      core->strand_open(obj);
      if (drop) AgentCore::release_object(drop);
    };
    if (bad) {
      created(bad, {});
      return error(bad);
    }
    c.pool->post([core, caller, id, fn, entry, created, args = std::move(args)] {
      ObjectValue v;
      auto r = run_entry(core, caller, fn, [&](Agent& a, Decoder& d, Encoder&) { v = entry->make_object(a, d); },
                         args);
      std::exception_ptr e;
      if (r->status != 0) e = make_error(r->kind, r->op, r->detail, r->err_rank);
      created(e, std::move(v));
      post_fin(core, caller, id, std::move(r));
    });
    return;
  }
  // method (or __rref.fetch) on an owned value, in its strand
  ObjectPtr obj;
  {
    std::lock_guard<std::mutex> lock(c.obj_mutex);
    if (c.freed.count(target))
      return error(std::make_exception_ptr(StateError(
          "rpc", "'" + fn + "': the RRef's value on " + c.who(c.rank) + " was freed already", c.rank)));
    obj = c.get_or_placeholder_locked(target);
  }
  c.strand_post(obj, [core, obj, caller, id, fn, args = std::move(args)] {
    auto r = run_entry(core, caller, fn,
                       [&](Agent& a, Decoder& d, Encoder& out) {
                         if (obj->error) std::rethrow_exception(obj->error);
                         if (fn == "__rref.fetch") {
                           obj->v.encode(obj->v.value.get(), out);
                           return;
                         }
                         auto entry = find_function(fn);
                         if (!entry)
                           throw KeyError("rpc", "unknown method '" + fn + "' on " + core->who(core->rank) +
                                                     " (not registered in that process)", core->rank);
                         if (entry->target_type != obj->v.type)
                           throw TypeError("rpc", "method '" + fn + "' is for values of type " +
                                                      (entry->target_type.empty() ? "(none: a free function)"
                                                                                  : detail::readable_type_name(entry->target_type)) +
                                                      ", the RRef holds " + detail::readable_type_name(obj->v.type),
                                           core->rank);
                         entry->call(a, obj->v.value.get(), d, out);
                       },
                       args);
    post_fin(core, caller, id, std::move(r));
  });
}

/// Sends (or resends: same id) the request and arms its deadline.
void send_request(Self* self, std::uint64_t id, OutCall& call, int copies) {
  auto& st = self->state;
  const auto& s = call.spec;
  ++call.attempts;
  for (int k = 0; k < copies; ++k)
    self->send(st.peers[static_cast<std::size_t>(call.dest)], caf::atom("rpcreq"), st.core->rank, id,
               static_cast<int>(s.mode), s.fn, s.target, s.new_object, s.args);
  self->delayed_send(self, s.timeout.value_or(st.core->options.rpc_timeout), caf::atom("rpctmo"), id,
                     call.attempts);
}

void on_lost(Self* self, int r, const std::string& what) {
  auto& st = self->state;
  auto& c = *st.core;
  {
    std::lock_guard<std::mutex> lock(c.st_mutex);
    if (c.lost.count(r)) return;
  }
  for (auto it = st.pending.begin(); it != st.pending.end();) {
    if (it->second->dest == r) {
      auto call = it->second;
      it = st.pending.erase(it);
      fail_call(call, std::make_exception_ptr(PeerLostError(
                          "rpc", "call of '" + call->spec.fn + "' from " + c.who(c.rank) + " to " + c.who(r) +
                                     " failed: " + c.who(r) + " was lost (" + what + ")", c.rank)));
    } else {
      ++it;
    }
  }
  st.done.erase(r);
  st.done_order.erase(r);
  st.done_bytes.erase(r);
  for (auto it = st.running.begin(); it != st.running.end();) it = it->first == r ? st.running.erase(it) : std::next(it);
  c.drop_worker(r);
  {
    std::lock_guard<std::mutex> lock(c.st_mutex);
    c.lost.insert(r);
  }
  c.st_cv.notify_all();
}

caf::behavior agent_actor(Self* self, std::shared_ptr<AgentCore> core) {
  self->state.core = std::move(core);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (int r = 0; r < static_cast<int>(st.peers.size()); ++r) {
      if (r == st.core->rank || st.peers[static_cast<std::size_t>(r)].address() != dm.source) continue;
      const bool cut = dm.reason == caf::exit_reason::remote_link_unreachable;
      on_lost(self, r,
              cut ? std::string("the connection to its process was lost: the process died or the network failed")
                  : "its agent exited: " + to_string(dm.reason));
    }
  });
  return {
      [self](caf::atom_constant<caf::atom("rpcinit")>, const AgentPeersPtr& p) {
        auto& st = self->state;
        st.peers = p->actors;
        for (int r = 0; r < static_cast<int>(st.peers.size()); ++r)
          if (r != st.core->rank) self->monitor(st.peers[static_cast<std::size_t>(r)]);
        return true;
      },
      [self](caf::atom_constant<caf::atom("rpcout")>, const OutCallPtr& call) {
        auto& st = self->state;
        auto& c = *st.core;
        const int d = call->dest;
        if (c.is_lost(d) || st.peers.empty()) {
          fail_call(call, std::make_exception_ptr(PeerLostError(
                              "rpc", "call of '" + call->spec.fn + "' from " + c.who(c.rank) + " to " + c.who(d) +
                                         " failed: " + c.who(d) + " is gone", c.rank)));
          return;
        }
        const std::uint64_t id = st.next_call++;
        st.pending[id] = call;
        send_request(self, id, *call, std::max(1, call->spec.copies));
      },
      [self](caf::atom_constant<caf::atom("rpcreq")>, int caller, std::uint64_t id, int mode, const std::string& fn,
             std::uint64_t target, std::uint64_t newobj, std::vector<char>& args) {
        auto& st = self->state;
        if (st.core->is_lost(caller)) return;
        if (auto d = st.done.find(caller); d != st.done.end())
          if (auto r = d->second.find(id); r != d->second.end()) return send_reply(self, caller, id, r->second);
        if (!st.running.insert({caller, id}).second) return;  // a repeat while it runs: its reply comes once
        dispatch(self, caller, id, mode, fn, target, newobj, std::move(args));
      },
      [self](caf::atom_constant<caf::atom("rpcfin")>, int caller, std::uint64_t id, const ReplyPtr& r) {
        finish(self, caller, id, r);
      },
      [self](caf::atom_constant<caf::atom("rpcrep")>, std::uint64_t id, int status, const std::string& kind,
             const std::string& op, const std::string& detail, int err_rank, std::vector<char>& bytes) {
        auto& st = self->state;
        auto it = st.pending.find(id);
        if (it == st.pending.end()) return;  // late (timed out) or a repeat
        auto call = it->second;
        st.pending.erase(it);
        if (status == 0)
          call->promise.set_value(std::move(bytes));
        else
          fail_call(call, make_error(kind, op, detail, err_rank >= 0 ? std::optional<int>(err_rank) : std::nullopt));
      },
      [self](caf::atom_constant<caf::atom("rpctmo")>, std::uint64_t id, int attempt) {
        auto& st = self->state;
        auto it = st.pending.find(id);
        if (it == st.pending.end() || it->second->attempts != attempt) return;
        auto call = it->second;
        if (call->attempts <= call->spec.retries) {
          send_request(self, id, *call, 1);  // the callee runs it at most once
          return;
        }
        st.pending.erase(it);
        auto& c = *st.core;
        const auto ms = call->spec.timeout.value_or(c.options.rpc_timeout).count();
        fail_call(call, std::make_exception_ptr(TimeoutError(
                            "rpc", "call of '" + call->spec.fn + "' from " + c.who(c.rank) + " to " +
                                       c.who(call->dest) + " got no reply within " + std::to_string(ms) + " ms" +
                                       (call->attempts > 1 ? " (each of " + std::to_string(call->attempts) + " attempts)"
                                                           : std::string()),
                            c.rank)));
      },
  };
}

std::shared_ptr<AgentCore> make_core(caf::actor_system& sys, const std::string& name, int rank, int world,
                                     const RpcOptions& options) {
  if (options.num_worker_threads < 1)
    throw ValueError("rpc", "num_worker_threads must be >= 1, got " + std::to_string(options.num_worker_threads));
  if (options.rpc_timeout.count() <= 0) throw ValueError("rpc", "rpc_timeout must be positive");
  auto core = std::make_shared<AgentCore>();
  core->name = name;
  core->rank = rank;
  core->world = world;
  core->options = options;
  core->sys = &sys;
  core->pool = std::make_unique<Pool>(options.num_worker_threads);
  ::dopt::detail::UserThreadCafScope caf_scope;
  core->actor = sys.spawn(agent_actor, core);
  return core;
}

void start_agent(caf::actor_system& sys, const std::shared_ptr<AgentCore>& core, std::vector<caf::actor> peers) {
  auto p = std::make_shared<AgentPeers>();
  p->actors = std::move(peers);
  ::dopt::detail::UserThreadCafScope caf_scope;
  caf::scoped_actor self{sys};
  self->request(core->handle(), caf::infinite, caf::atom("rpcinit"), AgentPeersPtr(p))
      .receive([](bool) {},
               [&](caf::error& e) {
                 throw StateError("rpc.init", "the agent did not start: " + sys.render(e), core->rank);
               });
}

void check_names(const std::vector<std::string>& names, int rank) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) throw ValueError("rpc.init", "rank " + std::to_string(i) + " has an empty name", rank);
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] == names[j])
        throw ValueError("rpc.init", "ranks " + std::to_string(j) + " and " + std::to_string(i) +
                                         " have the same name '" + names[i] + "' (names must be unique)", rank);
  }
}

}  // namespace

// --- gradient contexts ----------------------------------------------------------------------

struct ContextState {
  std::shared_ptr<AgentCore> core;
  std::uint64_t id = 0;
  bool owns = false;
  std::mutex m;
  std::set<int> owners;
  std::vector<Future<void>> deposits;
  bool released = false;
  void release() {
    std::set<int> os;
    {
      std::lock_guard<std::mutex> lock(m);
      if (released) return;
      released = true;
      os.swap(owners);
    }
    for (int o : os) (void)send_call(core, make_spec(To(o), Fn("__ctx.release"), Mode::call, id));
  }
  ~ContextState() {
    if (owns) release();
  }
};

namespace {
Future<void> when_all(std::vector<Future<void>> fs) {
  if (fs.empty()) return make_ready_future();
  struct Join {
    std::mutex m;
    std::size_t left;
    std::exception_ptr first;
    Promise<void> p;
  };
  auto j = std::make_shared<Join>();
  j->left = fs.size();
  for (auto& f : fs)
    (void)f.then([j](const Future<void>& g) {
      bool last;
      {
        std::lock_guard<std::mutex> lock(j->m);
        if (auto e = g.exception(); e && !j->first) j->first = e;
        last = --j->left == 0;
      }
      if (last) {
        if (j->first)
          j->p.set_exception(j->first);
        else
          j->p.set_value();
      }
    });
  return j->p.get_future();
}
}  // namespace

}  // namespace detail

std::uint64_t GradContext::id() const {
  if (!s_) throw StateError("GradContext", "the context is empty (default-constructed)");
  return s_->id;
}
int GradContext::creator_rank() const { return static_cast<int>(id() >> 48); }

Future<void> GradContext::deposit(const RRef<Tensor>& param, const Tensor& grad) { return deposit_all({{param, grad}}); }

Future<void> GradContext::deposit_all(const std::vector<std::pair<RRef<Tensor>, Tensor>>& grads) {
  if (!s_) throw StateError("GradContext.deposit", "the context is empty (default-constructed)");
  std::map<int, std::vector<std::pair<std::uint64_t, Tensor>>> by_owner;
  for (const auto& [p, g] : grads) {
    if (!p.valid()) throw ValueError("GradContext.deposit", "an empty RRef");
    by_owner[p.owner_rank()].emplace_back(p.id(), g);
  }
  std::vector<Future<void>> fs;
  {
    std::lock_guard<std::mutex> lock(s_->m);
    if (s_->released) throw StateError("GradContext.deposit", "context " + std::to_string(s_->id) + " was released");
    for (auto& [owner, list] : by_owner) {
      auto f = detail::typed_result<void>(
          s_->core, detail::send_call(s_->core, detail::make_spec(To(owner), Fn("__ctx.deposit"), detail::Mode::call,
                                                                  s_->id, list)),
          "deposit");
      s_->owners.insert(owner);
      s_->deposits.push_back(f);
      fs.push_back(f);
    }
  }
  return detail::when_all(std::move(fs));
}

Future<void> GradContext::deposits_done() const {
  if (!s_) throw StateError("GradContext", "the context is empty (default-constructed)");
  std::vector<Future<void>> fs;
  {
    std::lock_guard<std::mutex> lock(s_->m);
    fs = s_->deposits;
  }
  return detail::when_all(std::move(fs));
}

void GradContext::release() {
  if (s_) s_->release();
}
bool GradContext::released() const {
  if (!s_) return true;
  std::lock_guard<std::mutex> lock(s_->m);
  return s_->released;
}

// --- Agent ------------------------------------------------------------------------------------

Agent::Agent(std::shared_ptr<detail::AgentCore> core) : core_(std::move(core)) {
  if (!core_) throw StateError("rpc.Agent", "no agent");
}
const std::string& Agent::name() const { return core_->name; }
int Agent::rank() const { return core_->rank; }
int Agent::world_size() const { return core_->world; }
WorkerInfo Agent::worker_info() const { return {core_->name, core_->rank}; }
WorkerInfo Agent::worker_info(const std::string& name) const {
  return detail::core_worker(*core_, detail::resolve_rank(*core_, To(name), "rpc.worker_info"));
}
WorkerInfo Agent::worker_info(int rank) const { return detail::core_worker(*core_, rank); }
std::vector<WorkerInfo> Agent::workers() const {
  std::vector<WorkerInfo> out;
  for (int r = 0; r < core_->world; ++r) out.push_back(detail::core_worker(*core_, r));
  return out;
}
const RpcOptions& Agent::options() const { return core_->options; }

GradContext Agent::new_context() const {
  auto s = std::make_shared<detail::ContextState>();
  s->core = core_;
  s->id = (static_cast<std::uint64_t>(core_->rank) << 48) | core_->next_context.fetch_add(1);
  s->owns = true;
  return GradContext(std::move(s));
}
GradContext Agent::attach_context(std::uint64_t id) const {
  auto s = std::make_shared<detail::ContextState>();
  s->core = core_;
  s->id = id;
  s->owns = false;
  return GradContext(std::move(s));
}
Tensor Agent::context_grad(std::uint64_t ctx, std::uint64_t obj) const {
  std::lock_guard<std::mutex> lock(core_->ctx_mutex);
  auto it = core_->contexts.find(ctx);
  if (it == core_->contexts.end()) return Tensor();
  auto g = it->second.find(obj);
  return g == it->second.end() ? Tensor() : g->second;
}
void Agent::drop_context_grads(std::uint64_t ctx, const std::vector<std::uint64_t>& objs) const {
  std::lock_guard<std::mutex> lock(core_->ctx_mutex);
  auto it = core_->contexts.find(ctx);
  if (it == core_->contexts.end()) return;
  for (auto o : objs) it->second.erase(o);
}
std::size_t Agent::num_contexts() const {
  std::lock_guard<std::mutex> lock(core_->ctx_mutex);
  return core_->contexts.size();
}
std::size_t Agent::num_owned() const {
  std::lock_guard<std::mutex> lock(core_->obj_mutex);
  return core_->objects.size();
}

bool Agent::wait_until_lost(const To& worker, std::chrono::milliseconds timeout) const {
  const int r = detail::resolve_rank(*core_, worker, "rpc.wait_until_lost");
  std::unique_lock<std::mutex> lock(core_->st_mutex);
  return core_->st_cv.wait_for(lock, timeout, [&] { return core_->lost.count(r) > 0; });
}

bool Agent::alive() const { return static_cast<bool>(core_->handle()); }

void Agent::kill() const { core_->stop(true); }

void Agent::shutdown() const {
  auto& c = *core_;
  if (c.shutting_down.exchange(true)) return;
  if (!c.handle()) return;
  const auto deadline = steady_clock::now() + c.options.shutdown_timeout;
  auto idle = [&] { return c.outstanding == 0 || c.stopped; };
  {
    std::unique_lock<std::mutex> lock(c.st_mutex);
    c.st_cv.wait_until(lock, deadline, idle);
  }
  for (int r = 0; r < c.world; ++r)
    if (r != c.rank && !c.is_lost(r)) (void)detail::send_call(core_, detail::make_spec(To(r), Fn("__bye"), detail::Mode::call));
  std::vector<int> missing;
  {
    std::unique_lock<std::mutex> lock(c.st_mutex);
    auto all_done = [&] {
      if (c.stopped) return true;
      for (int r = 0; r < c.world; ++r)
        if (r != c.rank && !c.bye_from.count(r) && !c.lost.count(r)) return false;
      return true;
    };
    if (!c.st_cv.wait_until(lock, deadline, all_done))
      for (int r = 0; r < c.world; ++r)
        if (r != c.rank && !c.bye_from.count(r) && !c.lost.count(r)) missing.push_back(r);
    c.st_cv.wait_until(lock, deadline, idle);
  }
  c.stop(false);
  if (!missing.empty()) {
    std::string who;
    for (int r : missing) who += (who.empty() ? "" : ", ") + c.who(r);
    throw TimeoutError("rpc.shutdown", "workers did not finish within " +
                                           std::to_string(c.options.shutdown_timeout.count()) + " ms: " + who,
                       c.rank);
  }
}

bool is_registered(const std::string& name) { return detail::find_function(name) != nullptr; }

// --- starting workers ----------------------------------------------------------------------

Agent init(Runtime& runtime, const std::string& name, int rank, int world_size, const RpcOptions& options) {
  ::dopt::detail::UserThreadCafScope caf_scope;
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw ValueError("rpc.init", "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_size) + ")",
                     rank);
  if (name.empty()) throw ValueError("rpc.init", "the worker name is empty", rank);
  LaunchEnv env;
  if (options.launch)
    env = *options.launch;
  else if (auto e = launch_env_from_environment())
    env = *e;
  env.rank = rank;
  env.world_size = world_size;
  auto& sys = dopt::detail::runtime_system(runtime.impl(), "rpc.init");
  auto core = detail::make_core(sys, name, rank, world_size, options);
  std::weak_ptr<detail::AgentCore> weak = core;
  dopt::detail::runtime_add_stopper(runtime.impl(), [weak] {
    if (auto c = weak.lock()) c->stop(false);
  });
  try {
    caf::actor a = core->handle();
    char hostname[256] = {};
    ::gethostname(hostname, sizeof hostname - 1);
    const std::string host = hostname;
    auto make_info = [&] {
      // The agent's port is behind dopt's handshake (job id, secret): only the
      // job's own workers reach its functions.
      return "host=" + host + dopt::detail::publish_control_port(runtime.impl(), sys, a, env, "rpc.init") +
             " name=" + name;
    };
    RendezvousResult rdv = dopt::detail::rendezvous_with(runtime, env, options.init_timeout, a, make_info);
    const auto& infos = dopt::detail::rendezvous_infos(rdv);
    auto field = [](const std::string& text, const std::string& key, bool rest) {
      auto p = text.find(key + "=");
      if (p == std::string::npos) return std::string();
      p += key.size() + 1;
      return rest ? text.substr(p) : text.substr(p, text.find(' ', p) - p);
    };
    core->names.clear();
    for (const auto& info : infos) core->names.push_back(field(info, "name", true));
    detail::check_names(core->names, rank);
    std::vector<caf::actor> peers = dopt::detail::rendezvous_payloads(rdv);
    peers[static_cast<std::size_t>(rank)] = a;
    // Direct connections (as init_process_group): rank i > 0 connects to
    // every rank above it, so that every death is seen by every worker.
    dopt::detail::setup_step(rdv, rank, "rpc.init", [&] {
      for (int r = std::max(1, rank + 1); rank > 0 && r < world_size; ++r)
        peers[static_cast<std::size_t>(r)] = dopt::detail::connect_control_port(
            sys, env, r, "host=" + host, infos[static_cast<std::size_t>(r)], "rpc.init");
    });
    detail::start_agent(sys, core, std::move(peers));
    rdv.barrier(options.init_timeout);
    core->keep = std::make_shared<RendezvousResult>(rdv);
  } catch (...) {
    core->stop(true);
    throw;
  }
  return Agent(core);
}

void simulate(int n, const std::function<void(Agent&)>& fn, const SimulateRpcOptions& options) {
  if (n < 1) throw ValueError("rpc.simulate", "n must be >= 1, got " + std::to_string(n));
  if (!fn) throw ValueError("rpc.simulate", "fn is empty");
  std::vector<std::string> names = options.names;
  if (names.empty())
    for (int r = 0; r < n; ++r) names.push_back("worker" + std::to_string(r));
  if (static_cast<int>(names.size()) != n)
    throw ValueError("rpc.simulate", std::to_string(names.size()) + " names for " + std::to_string(n) + " workers");
  detail::check_names(names, 0);
  std::optional<Runtime> own;
  Runtime* rt = options.runtime;
  if (!rt) rt = &own.emplace(options.runtime_options);
  auto& sys = dopt::detail::runtime_system(rt->impl(), "rpc.simulate");
  std::vector<std::shared_ptr<detail::AgentCore>> cores;
  std::vector<caf::actor> actors;
  for (int r = 0; r < n; ++r) {
    cores.push_back(detail::make_core(sys, names[static_cast<std::size_t>(r)], r, n, options.rpc));
    cores.back()->names = names;
    actors.push_back(cores.back()->handle());
    std::weak_ptr<detail::AgentCore> weak = cores.back();
    dopt::detail::runtime_add_stopper(rt->impl(), [weak] {
      if (auto c = weak.lock()) c->stop(true);
    });
  }
  for (auto& c : cores) detail::start_agent(sys, c, actors);
  actors.clear();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Agent agent(cores[static_cast<std::size_t>(r)]);
      try {
        fn(agent);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        agent.kill();
        return;
      }
      try {
        agent.shutdown();
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& c : cores) c->stop(true);
  cores.clear();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void run(const std::function<void(Agent&)>& fn, int simulated_workers, const std::function<std::string(int)>& names,
         const SimulateRpcOptions& options) {
  auto name_of = [&](int r) { return names ? names(r) : "worker" + std::to_string(r); };
  if (auto env = launch_env_from_environment()) {
    Runtime rt(options.runtime_options);
    Agent agent = init(rt, name_of(env->rank), env->rank, env->world_size, options.rpc);
    fn(agent);
    agent.shutdown();
    return;
  }
  SimulateRpcOptions o = options;
  o.names.clear();
  for (int r = 0; r < simulated_workers; ++r) o.names.push_back(name_of(r));
  simulate(simulated_workers, fn, o);
}

}  // namespace dopt::rpc
