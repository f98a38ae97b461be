// dopt::Runtime: the embedded actor system, and the spawning of rank actors.
#include <cerrno>
#include "dopt/runtime/settings.hpp"
#include <cstdlib>

#include "transport/actor/rank_state.hpp"
#include "core/runtime_impl.hpp"

namespace dopt {

void Runtime::Impl::shutdown() noexcept {
  std::vector<std::weak_ptr<detail::LocalEndpoint>> eps;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<std::function<void()>> stoppers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    eps.swap(endpoints_);
    stoppers.swap(stoppers_);
    sys = std::move(system_);
  }
  for (auto& w : eps)
    if (auto ep = w.lock()) ep->stop();
  for (auto& f : stoppers) f();
  sys.reset();  // joins CAF's threads once every actor has exited
}

}  // namespace dopt

namespace dopt::detail {

caf::actor_system& runtime_system(RuntimeImpl& rt, const char* op) { return rt.system(op); }
void runtime_add_stopper(RuntimeImpl& rt, std::function<void()> stop) { rt.add_stopper(std::move(stop)); }

std::vector<std::shared_ptr<RankEndpoint>> spawn_rank_actors(caf::actor_system& sys, int world_size,
                                                              std::chrono::milliseconds timeout,
                                                              std::vector<caf::actor>* actors,
                                                              std::shared_ptr<PeerTable> table) {
  UserThreadCafScope caf_scope;
  auto peers = std::make_shared<Peers>();
  peers->table = table ? std::move(table) : std::make_shared<PeerTable>(world_size, true);
  for (int r = 0; r < world_size; ++r) peers->actors.push_back(sys.spawn(rank_actor, r, world_size));
  PeersPtr pp = peers;
  std::vector<std::shared_ptr<RankEndpoint>> out;
  for (int r = 0; r < world_size; ++r) {
    auto& a = peers->actors[static_cast<std::size_t>(r)];
    caf::anon_send(a, init_atom::value, pp);
    out.push_back(std::make_shared<LocalEndpoint>(a, r, world_size, timeout, peers->table));
  }
  if (actors) *actors = peers->actors;
  return out;
}

LocalWorld spawn_local_world(RuntimeImpl& rt, int world_size) {
  LocalWorld w;
  w.table = std::make_shared<PeerTable>(world_size, true);
  w.endpoints = spawn_rank_actors(rt.system("simulate"), world_size, rt.options_.collective_timeout, nullptr, w.table);
  for (auto& ep : w.endpoints) rt.add_endpoint(std::static_pointer_cast<LocalEndpoint>(ep));
  return w;
}

}  // namespace dopt::detail

namespace dopt {

RuntimeOptions RuntimeOptions::from_env() {
  RuntimeOptions o;
  o.threads = static_cast<int>(settings::integer("DOPT_THREADS").value_or(0));
  o.policy = settings::text("DOPT_SCHEDULER_POLICY").value_or(o.policy);
  o.collective_timeout =
      std::chrono::milliseconds(settings::integer("DOPT_TIMEOUT_MS").value_or(o.collective_timeout.count()));
  o.peer_timeout = std::chrono::milliseconds(settings::integer("DOPT_PEER_TIMEOUT_MS").value_or(o.peer_timeout.count()));
  o.validate();
  settings::note_undeclared();
  return o;
}

void RuntimeOptions::validate() const {
  if (threads < 0 || threads > 4096)
    throw ValueError("Runtime", "threads must be in [0, 4096], got " + std::to_string(threads));
  if (policy != "stealing" && policy != "sharing")
    throw ValueError("Runtime", "scheduler policy must be 'stealing' or 'sharing', got '" + policy + "'");
  if (moderate_poll_attempts < 0)
    throw ValueError("Runtime", "moderate_poll_attempts must be >= 0, got " + std::to_string(moderate_poll_attempts));
  if (peer_timeout.count() < 100)
    throw ValueError("Runtime", "peer_timeout must be at least 100 ms, got " + std::to_string(peer_timeout.count()) +
                                    " ms");
  if (collective_timeout.count() <= 0)
    throw ValueError("Runtime", "collective_timeout must be positive, got " +
                                    std::to_string(collective_timeout.count()) + " ms");
}

Runtime::Runtime(RuntimeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Runtime::~Runtime() { shutdown(); }
void Runtime::shutdown() noexcept {
  if (impl_) impl_->shutdown();
}
bool Runtime::running() const noexcept { return impl_ && impl_->running(); }
const RuntimeOptions& Runtime::options() const noexcept { return impl_->options_; }
int Runtime::threads() const noexcept { return impl_->threads_; }
Runtime::Impl& Runtime::impl() { return *impl_; }

}  // namespace dopt

