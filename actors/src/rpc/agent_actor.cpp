// The agent of a worker as a CAF actor: the link of threads and real
// processes. Its messages are the wire format (core.hpp); what it does with
// each is in handlers.cpp.
#include "core/caf_thread.hpp"
#include "rpc/handlers.hpp"

namespace dopt::rpc::detail {

namespace {

struct ActorState {
  AgentState agent;
  std::vector<caf::actor> peers;
  static const char* name;
};
const char* ActorState::name = "dopt.rpc.agent";

using Self = caf::stateful_actor<ActorState>;

class CafLink final : public AgentLink {
 public:
  explicit CafLink(Self* self) : self_(self) {}
  void request(int dest, const Request& r) override {
    self_->send(self_->state.peers[static_cast<std::size_t>(dest)], caf::atom("rpcreq"), r.caller, r.id, r.mode, r.fn,
                r.target, r.new_object, r.args);
  }
  void reply(int dest, std::uint64_t id, const ReplyPtr& r) override {
    if (dest >= static_cast<int>(self_->state.peers.size())) return;
    self_->send(self_->state.peers[static_cast<std::size_t>(dest)], caf::atom("rpcrep"), id, r->status, r->kind, r->op,
                r->detail, r->err_rank, r->bytes);
  }
  void arm_timeout(std::chrono::milliseconds d, std::uint64_t id, int attempt) override {
    self_->delayed_send(self_, d, caf::atom("rpctmo"), id, attempt);
  }

 private:
  Self* self_;
};

caf::behavior agent_actor(Self* self, std::shared_ptr<AgentCore> core) {
  self->state.agent.core = std::move(core);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    CafLink link(self);
    for (int r = 0; r < static_cast<int>(st.peers.size()); ++r) {
      if (r == st.agent.core->rank || st.peers[static_cast<std::size_t>(r)].address() != dm.source) continue;
      const bool cut = dm.reason == caf::exit_reason::remote_link_unreachable;
      handle_lost(st.agent, link, r,
                  cut ? std::string("the connection to its process was lost: the process died or the network failed")
                      : "its agent exited: " + to_string(dm.reason));
    }
  });
  return {
      [self](caf::atom_constant<caf::atom("rpcinit")>, const AgentPeersPtr& p) {
        auto& st = self->state;
        st.peers = p->actors;
        st.agent.started = !st.peers.empty();
        for (int r = 0; r < static_cast<int>(st.peers.size()); ++r)
          if (r != st.agent.core->rank) self->monitor(st.peers[static_cast<std::size_t>(r)]);
        return true;
      },
      [self](caf::atom_constant<caf::atom("rpcout")>, const OutCallPtr& call) {
        CafLink link(self);
        handle_out(self->state.agent, link, call);
      },
      [self](caf::atom_constant<caf::atom("rpcreq")>, int caller, std::uint64_t id, int mode, const std::string& fn,
             std::uint64_t target, std::uint64_t newobj, std::vector<char>& args) {
        CafLink link(self);
        handle_request(self->state.agent, link, Request{caller, id, mode, fn, target, newobj, std::move(args)});
      },
      [self](caf::atom_constant<caf::atom("rpcfin")>, int caller, std::uint64_t id, const ReplyPtr& r) {
        CafLink link(self);
        handle_fin(self->state.agent, link, caller, id, r);
      },
      [self](caf::atom_constant<caf::atom("rpcrep")>, std::uint64_t id, int status, const std::string& kind,
             const std::string& op, const std::string& detail, int err_rank, std::vector<char>& bytes) {
        CafLink link(self);
        handle_reply(self->state.agent, link, id, Reply{status, kind, op, detail, err_rank, std::move(bytes)});
      },
      [self](caf::atom_constant<caf::atom("rpctmo")>, std::uint64_t id, int attempt) {
        CafLink link(self);
        handle_timeout(self->state.agent, link, id, attempt);
      },
  };
}

}  // namespace

std::shared_ptr<AgentCore> new_core(const std::string& name, int rank, int world, const RpcOptions& options) {
  if (options.num_worker_threads < 1)
    throw ValueError("rpc", "num_worker_threads must be >= 1, got " + std::to_string(options.num_worker_threads));
  if (options.rpc_timeout.count() <= 0) throw ValueError("rpc", "rpc_timeout must be positive");
  auto core = std::make_shared<AgentCore>();
  core->name = name;
  core->rank = rank;
  core->world = world;
  core->options = options;
  core->pool = std::make_unique<Pool>(options.num_worker_threads);
  return core;
}

std::shared_ptr<AgentCore> make_core(caf::actor_system& sys, const std::string& name, int rank, int world,
                                     const RpcOptions& options) {
  auto core = new_core(name, rank, world, options);
  core->sys = &sys;
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
