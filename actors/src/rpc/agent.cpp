// rpc::Agent: the worker's handle (names, ranks, graceful shutdown), and
// the test hooks of rpc/testing.hpp.
#include "rpc/testing.hpp"

#include "rpc/core.hpp"

namespace dopt::rpc {

using namespace std::chrono;

Agent::Agent(std::shared_ptr<AgentCore> core) : core_(std::move(core)) {
  if (!core_) throw StateError("rpc.Agent", "no agent");
}
const std::string& Agent::name() const { return core_->name; }
int Agent::rank() const { return core_->rank; }
int Agent::world_size() const { return core_->world; }
std::uint64_t Agent::bytes_sent() const { return core_->bytes_sent.load(std::memory_order_relaxed); }
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

bool Agent::wait_until_lost(const To& worker, std::chrono::milliseconds timeout) const {
  const int r = detail::resolve_rank(*core_, worker, "rpc.wait_until_lost");
  namespace sim = ::dopt::detail::sim;
  std::unique_lock<std::mutex> lock(core_->st_mutex);
  return sim::cv_wait_until(core_->st_cv, lock, sim::clock_now() + timeout, [&] { return core_->lost.count(r) > 0; },
                            "rpc wait_until_lost");
}

bool Agent::alive() const { return core_->running(); }

void Agent::shutdown() const {
  auto& c = *core_;
  if (c.shutting_down.exchange(true)) return;
  if (!c.running()) return;
  namespace sim = ::dopt::detail::sim;
  const auto deadline = sim::clock_now() + c.options.shutdown_timeout;  // virtual time when simulated
  auto idle = [&] { return c.outstanding == 0 || c.stopped; };
  {
    std::unique_lock<std::mutex> lock(c.st_mutex);
    sim::cv_wait_until(c.st_cv, lock, deadline, idle, "rpc shutdown");
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
    if (!sim::cv_wait_until(c.st_cv, lock, deadline, all_done, "rpc shutdown"))
      for (int r = 0; r < c.world; ++r)
        if (r != c.rank && !c.bye_from.count(r) && !c.lost.count(r)) missing.push_back(r);
    sim::cv_wait_until(c.st_cv, lock, deadline, idle, "rpc shutdown");
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

namespace testing {

void kill(const Agent& agent) { agent.core()->stop(true); }
std::size_t num_contexts(const Agent& agent) {
  auto& c = *agent.core();
  std::lock_guard<std::mutex> lock(c.ctx_mutex);
  return c.contexts.size();
}
std::size_t num_owned(const Agent& agent) {
  auto& c = *agent.core();
  std::lock_guard<std::mutex> lock(c.obj_mutex);
  return c.objects.size();
}

}  // namespace testing

}  // namespace dopt::rpc
