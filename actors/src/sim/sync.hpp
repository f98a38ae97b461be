#pragma once
// Internal to dopt_actors: more hooks of the deterministic scheduler (beside
// dopt/actors/internal/sim_hooks.hpp) for the RPC agents and ProcessGroup::shrink.
// Each does what its plain counterpart does when the caller is not simulated.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "dopt/actors/internal/sim_hooks.hpp"

namespace dopt::detail::sim {

/// A message of the calling task's rank is sent: the fault plan's decision
/// for it (the virtual delay of its delivery, or negative: dropped), counted
/// as on_message's, but not a scheduling point (the caller delivers it).
std::chrono::nanoseconds message_fault(const char* what);
/// Why the fault plan's partitions separate global ranks a and b now ("" when
/// they do not, or the caller is not simulated). Not a scheduling point.
std::string partition_between(int a, int b);
/// A message from global rank src to dst lost to a partition (why, from
/// partition_between): counted in the run report, the first on each link
/// recorded as a fault. `what` names the message ("rpc request of rank 0").
void lost_to_partition(int src, int dst, const std::string& what, const std::string& why);
/// The calling task's simulation: unique in this process (0: none).
std::uint64_t run_id();

/// cv.wait_until(lock, deadline, pred); when simulated, deadline is in the
/// scheduler's time (take it from clock_now()). Returns pred().
template <class Lock, class Cv, class Pred>
bool cv_wait_until(Cv& cv, Lock& lock, Clock::time_point deadline, Pred pred, const char* what) {
  if (active() && !pred()) [[unlikely]] {
    auto* m = lock.mutex();
    lock.unlock();
    const bool simulated = block([&] {
      std::lock_guard<std::remove_pointer_t<decltype(m)>> g(*m);
      return pred();
    }, deadline, what);
    lock.lock();
    if (simulated) return pred();
  }
  return cv.wait_until(lock, deadline, pred);
}

}  // namespace dopt::detail::sim
