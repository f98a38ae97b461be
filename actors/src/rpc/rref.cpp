// RRef reference counting, worker side: making, adopting and releasing
// holds, and the owner's values (rpc.hpp, "RRefs").
#include "rpc/core.hpp"

namespace dopt::rpc {

RRefState::~RRefState() {
  if (!core) return;
  try {
    // Release this worker's hold (fire and forget; counted for shutdown).
    (void)detail::send_call(core, detail::make_spec(To(owner), Fn("__rref.del"), detail::Mode::call, id, core->rank));
  } catch (...) {
  }
}

}  // namespace dopt::rpc

namespace dopt::rpc::detail {

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

void* local_object(AgentCore& core, std::uint64_t id, int owner, const std::string& type, const char* op) {
  if (owner != core.rank)
    throw StateError(op, "the value is owned by " + core.who(owner) + ", not by " + core.who(core.rank) +
                             " (to_here() fetches a copy)", core.rank);
  std::unique_lock<std::mutex> lock(core.obj_mutex);
  if (core.freed.count(id))
    throw StateError(op, "the value on " + core.who(core.rank) + " was freed already", core.rank);
  // A remote() still running here (e.g. a parameter made just before), or
  // one whose request has not arrived yet (the RRef came by another message
  // that got here first): wait for it.
  ObjectPtr keep = core.get_or_placeholder_locked(id);
  auto& o = *keep;
  namespace sim = ::dopt::detail::sim;
  if (!sim::cv_wait_until(core.obj_cv, lock, sim::clock_now() + core.options.rpc_timeout,
                          [&] { return o.created || core.stopped; }, "rpc value being created")) {
    const bool never_seen = !o.creation_seen;
    if (never_seen && o.counts.empty()) {  // the placeholder made here: not kept
      auto it = core.objects.find(id);
      if (it != core.objects.end() && it->second == keep) core.objects.erase(it);
    }
    throw TimeoutError(op, std::string(never_seen ? "no remote() making the value reached " + core.who(core.rank)
                                                  : "the value is still being created on " + core.who(core.rank)) +
                               " within " + std::to_string(core.options.rpc_timeout.count()) + " ms",
                       core.rank);
  }
  if (!o.created) throw StateError(op, "the agent stopped", core.rank);
  if (o.error) std::rethrow_exception(o.error);
  if (o.v.type != type)
    throw TypeError(op, "the value has type " + readable_type_name(o.v.type) + ", not " + readable_type_name(type),
                    core.rank);
  return o.v.value.get();
}

}  // namespace dopt::rpc::detail
