#pragma once
// Internal to dopt_actors: more hooks of the deterministic scheduler (beside
// dopt/actors/internal/sim_hooks.hpp) for the RPC agents and ProcessGroup::shrink.
// Each does what its plain counterpart does when the caller is not simulated.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "dopt/actors/internal/sim_hooks.hpp"

namespace dopt::detail::sim {

/// A message of the calling task's rank is sent: the fault plan's decision
/// for it (the virtual delay of its delivery, or negative: dropped), counted
/// as on_message's, but not a scheduling point (the caller delivers it).
std::chrono::nanoseconds message_fault(const char* what);
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
