// Gradient contexts (rpc.hpp, "Gradient contexts"): the creator's handle
// and the owners' deposited gradients.
#include "rpc/core.hpp"

namespace dopt::rpc {

/// A context's state: the creator's handles share it (rpc.hpp declares it).
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
    for (int o : os)
      (void)detail::send_call(core, detail::make_spec(To(o), Fn("__ctx.release"), detail::Mode::call, id));
  }
  ~ContextState() {
    if (owns) release();
  }
};

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
  return when_all(fs);
}

Future<void> GradContext::deposits_done() const {
  if (!s_) throw StateError("GradContext", "the context is empty (default-constructed)");
  std::vector<Future<void>> fs;
  {
    std::lock_guard<std::mutex> lock(s_->m);
    fs = s_->deposits;
  }
  return when_all(fs);
}

void GradContext::release() {
  if (s_) s_->release();
}
bool GradContext::released() const {
  if (!s_) return true;
  std::lock_guard<std::mutex> lock(s_->m);
  return s_->released;
}

GradContext Agent::new_context() const {
  auto s = std::make_shared<ContextState>();
  s->core = core_;
  s->id = (static_cast<std::uint64_t>(core_->rank) << 48) | core_->next_context.fetch_add(1);
  s->owns = true;
  return GradContext(std::move(s));
}
GradContext Agent::attach_context(std::uint64_t id) const {
  auto s = std::make_shared<ContextState>();
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

}  // namespace dopt::rpc
