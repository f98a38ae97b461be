// Outgoing calls: from a user thread to its agent (send_call, post_call),
// handing the RRefs a message carries on to its receiver first.
#include "rpc/core.hpp"

namespace dopt::rpc::detail {

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
  // Deterministic simulation: a user's call from its own thread (not the
  // built-ins that RRef and context handles send, nor calls made by
  // continuations on the agent) is a scheduling point, and a call a fault
  // plan may crash the worker at.
  if (::dopt::detail::sim::active() && !in_sim_agent() &&
      (call->spec.fn.rfind("__", 0) != 0 || call->spec.fn == "__rref.fetch")) [[unlikely]]
    ::dopt::detail::sim::on_call("rpc");
  if (!core->running()) {
    call->promise.set_exception(std::make_exception_ptr(
        StateError("rpc", call_text(*core, call->spec, call->dest) + ": " + core->who(core->rank) + " is shut down",
                   core->rank)));
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
  core->send_out(OutCallPtr(std::move(call)));  // a stopped agent drops it: the call fails (~OutCall)
  return fut;
}

}  // namespace dopt::rpc::detail
