// The network model's charges in the scheduler (network.hpp).
#include "sim/network.hpp"

#include <string>

#include "dopt/runtime/dtype.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"
#include "sim/network_cost.hpp"
#include "sim/scheduler.hpp"

namespace dopt::detail::sim {

void check_network(const dopt::sim::NetworkModel& m, int world_size) {
  auto bad = [](const std::string& why) { throw ValueError("simulate", "network model: " + why); };
  if (m.hosts < 1) bad("hosts must be >= 1, got " + std::to_string(m.hosts));
  if (m.ranks_per_host < 0) bad("ranks_per_host must be >= 0, got " + std::to_string(m.ranks_per_host));
  if (m.ranks_per_host > 0 && static_cast<long long>(m.hosts) * m.ranks_per_host < world_size)
    bad(std::to_string(world_size) + " ranks do not fit " + std::to_string(m.hosts) + " hosts x " +
        std::to_string(m.ranks_per_host) + " ranks");
  if (!(m.link_bandwidth > 0) || !(m.host_memory_bandwidth > 0) || m.host_cache_bandwidth < 0 ||
      !(m.exchange_bandwidth >= 0))
    bad("bandwidths must be positive");
  if (m.cores_per_host < 1) bad("cores_per_host must be >= 1");
  if (m.link_latency.count() < 0 || m.call_overhead.count() < 0 || m.sync_latency.count() < 0 ||
      m.wake_latency.count() < 0 || m.spin.count() < 0 || m.spin_past_cores.count() < 0)
    bad("latencies and spins must not be negative");
  if (m.shm_buffer_bytes == 0) bad("shm_buffer_bytes must be positive");
}

void Scheduler::set_network(const dopt::sim::NetworkModel& m) {
  check_network(m, world_size_);
  network_ = m;
  link_bytes_.assign(static_cast<std::size_t>(m.hosts), 0);
}

void Scheduler::charge(Task* me, std::int64_t ns, const std::vector<std::uint64_t>& link_bytes, bool count) {
  if (count) {
    modelled_ns_ += ns;
    for (std::size_t h = 0; h < link_bytes.size() && h < link_bytes_.size(); ++h) link_bytes_[h] += link_bytes[h];
  }
  if (ns > 0) sleep(me, ns, "network");
}

void Scheduler::fill_network(SimReport& r) const {
  if (!network_) return;
  if (r.link_bytes.size() < link_bytes_.size()) r.link_bytes.resize(link_bytes_.size(), 0);
  for (std::size_t h = 0; h < link_bytes_.size(); ++h) r.link_bytes[h] += link_bytes_[h];
  r.modelled_time += std::chrono::nanoseconds(modelled_ns_);
}

void model_call(const Op& op) {
  Task* me = tl_task;
  if (!me || me->sched->over()) return;
  Scheduler& s = *me->sched;
  const dopt::sim::NetworkModel* m = s.network();
  if (!m) return;
  const auto& d = op.desc;
  const std::size_t bytes =
      d.has_tensor() ? static_cast<std::size_t>(shape_numel(d.shape)) * itemsize(d.dtype) : 0;
  const std::vector<int>& members = *op.members;
  const int me_global = members[static_cast<std::size_t>(op.my_grank)];
  if (d.kind == CollKind::recv) return;
  if (d.kind == CollKind::send) {
    const CallCost c = send_cost(*m, s.world_size(), bytes, me_global, op.peer);
    return s.charge(me, c.ns, c.link_bytes, true);
  }
  const int root = d.root >= 0 && d.root < static_cast<int>(members.size()) ? members[static_cast<std::size_t>(d.root)] : -1;
  const CallCost c = collective_cost(*m, s.world_size(), d.kind, bytes, members, root);
  s.charge(me, c.ns, c.link_bytes, op.my_grank == 0);
}

}  // namespace dopt::detail::sim
