// The agent actor of a worker: sends requests, dispatches incoming calls
// to the pool (free functions), a value's strand (methods) or the built-ins,
// keeps the idempotency window, fails calls on deadlines and lost peers.
#include "caf_thread.hpp"
#include "rpc/core.hpp"

namespace dopt::rpc::detail {

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

}  // namespace

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

}  // namespace dopt::rpc::detail
