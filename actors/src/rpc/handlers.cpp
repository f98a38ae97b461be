// What an agent does with each message (handlers.hpp): sends requests,
// dispatches incoming calls to the pool (free functions), a value's strand
// (methods) or the built-ins, keeps the idempotency window, fails calls on
// deadlines and lost peers. The links (agent_actor.cpp, sim_agent.cpp) carry
// the messages.
#include "rpc/handlers.hpp"

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
  if (caller != core->rank && r) core->bytes_sent.fetch_add(r->bytes.size(), std::memory_order_relaxed);
  core->send_fin(caller, id, std::move(r));
}

/// Runs a user function or method; the reply, with RRefs handed on to the caller.
ReplyPtr run_entry(const std::shared_ptr<AgentCore>& core, int caller, const std::string& fn,
                   const std::function<void(Agent&, Decoder&, Encoder&)>& body, const std::vector<char>& args) {
  // Deterministic simulation: serving a call is one of the worker's calls
  // (a scheduling point; a fault plan may crash the worker here, before it runs).
  if (::dopt::detail::sim::active()) [[unlikely]]
    ::dopt::detail::sim::on_call("rpc serve");
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


void fail_call(const OutCallPtr& c, std::exception_ptr e) { c->promise.set_exception(std::move(e)); }

void send_reply(AgentState& st, AgentLink& link, int caller, std::uint64_t id, const ReplyPtr& r) {
  if (caller < 0 || caller >= st.core->world) return;
  link.reply(caller, id, r);
}

void finish(AgentState& st, AgentLink& link, int caller, std::uint64_t id, ReplyPtr r) {
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
  send_reply(st, link, caller, id, r);
}

void dispatch(AgentState& st, AgentLink& link, int caller, std::uint64_t id, int mode, const std::string& fn,
              std::uint64_t target, std::uint64_t newobj, std::vector<char> args) {
  auto core = st.core;
  auto& c = *core;
  auto error = [&](std::exception_ptr e) { finish(st, link, caller, id, error_reply(e, c, fn, false)); };
  if (static_cast<Mode>(mode) == Mode::call) {
    if (auto b = builtins().find(fn); b != builtins().end()) {
      try {
        Decoder d(args, core, "arguments of '" + fn + "'");
        b->second(c, caller, d);
        finish(st, link, caller, id, std::make_shared<Reply>());
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
          "rpc", user_call_text(fn) + ": the RRef's value on " + c.who(c.rank) + " was freed already", c.rank)));
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
void send_request(AgentState& st, AgentLink& link, std::uint64_t id, OutCall& call, int copies) {
  const auto& s = call.spec;
  ++call.attempts;
  Request r;
  r.caller = st.core->rank;
  r.id = id;
  r.mode = static_cast<int>(s.mode);
  r.fn = s.fn;
  r.target = s.target;
  r.new_object = s.new_object;
  r.args = s.args;
  if (call.dest != st.core->rank)
    st.core->bytes_sent.fetch_add(r.args.size() * static_cast<std::size_t>(copies), std::memory_order_relaxed);
  for (int k = 0; k < copies; ++k) link.request(call.dest, r);
  link.arm_timeout(s.timeout.value_or(st.core->options.rpc_timeout), id, call.attempts);
}

}  // namespace

void handle_lost(AgentState& st, AgentLink&, int r, const std::string& what) {
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
                          "rpc", call_text(c, call->spec, r) + " from " + c.who(c.rank) + " failed: " + c.who(r) +
                                     " was lost (" + what + ")", c.rank)));
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


void handle_out(AgentState& st, AgentLink& link, const OutCallPtr& call) {
  auto& c = *st.core;
  const int d = call->dest;
  if (c.is_lost(d) || !st.started) {
    fail_call(call, std::make_exception_ptr(PeerLostError(
                        "rpc", call_text(c, call->spec, d) + " from " + c.who(c.rank) + " failed: " + c.who(d) +
                                   " is gone", c.rank)));
    return;
  }
  const std::uint64_t id = st.next_call++;
  st.pending[id] = call;
  send_request(st, link, id, *call, std::max(1, call->spec.copies));
}

void handle_request(AgentState& st, AgentLink& link, Request&& q) {
  if (st.core->is_lost(q.caller)) return;
  if (auto d = st.done.find(q.caller); d != st.done.end())
    if (auto r = d->second.find(q.id); r != d->second.end()) return send_reply(st, link, q.caller, q.id, r->second);
  if (!st.running.insert({q.caller, q.id}).second) return;  // a repeat while it runs: its reply comes once
  dispatch(st, link, q.caller, q.id, q.mode, q.fn, q.target, q.new_object, std::move(q.args));
}

void handle_fin(AgentState& st, AgentLink& link, int caller, std::uint64_t id, const ReplyPtr& r) {
  finish(st, link, caller, id, r);
}

void handle_reply(AgentState& st, AgentLink&, std::uint64_t id, Reply r) {
  auto it = st.pending.find(id);
  if (it == st.pending.end()) return;  // late (timed out) or a repeat
  auto call = it->second;
  st.pending.erase(it);
  if (r.status == 0)
    call->promise.set_value(std::move(r.bytes));
  else
    fail_call(call, make_error(r.kind, r.op, r.detail, r.err_rank >= 0 ? std::optional<int>(r.err_rank) : std::nullopt));
}

void handle_timeout(AgentState& st, AgentLink& link, std::uint64_t id, int attempt) {
  auto it = st.pending.find(id);
  if (it == st.pending.end() || it->second->attempts != attempt) return;
  auto call = it->second;
  if (call->attempts <= call->spec.retries) {
    send_request(st, link, id, *call, 1);  // the callee runs it at most once
    return;
  }
  st.pending.erase(it);
  auto& c = *st.core;
  const auto ms = call->spec.timeout.value_or(c.options.rpc_timeout).count();
  fail_call(call, std::make_exception_ptr(TimeoutError(
                      "rpc", call_text(c, call->spec, call->dest) + " from " + c.who(c.rank) +
                                 " got no reply within " + std::to_string(ms) + " ms" +
                                 (call->attempts > 1 ? " (each of " + std::to_string(call->attempts) + " attempts)"
                                                     : std::string()),
                      c.rank)));
}

}  // namespace dopt::rpc::detail
