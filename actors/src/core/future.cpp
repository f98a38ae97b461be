// The waits of a future's slot (future.hpp): out of line, because under the
// deterministic simulation they hand the scheduler's baton on first.
#include "dopt/actors/future.hpp"

#include "dopt/actors/internal/sim_hooks.hpp"

namespace dopt {

void FutureSlot::wait() {
  if (detail::sim::active()) [[unlikely]]  // deterministic simulation: a scheduling point
    detail::sim::block([&] { return is_ready(); }, std::nullopt, "future");
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [&] { return ready; });
}

bool FutureSlot::wait_for(std::chrono::nanoseconds timeout) {
  if (detail::sim::active()) [[unlikely]] {  // virtual time
    const bool simulated = detail::sim::block(
        [&] { return is_ready(); },
        detail::sim::now() + std::chrono::duration_cast<detail::sim::Clock::duration>(timeout), "future");
    if (simulated) return is_ready();
  }
  std::unique_lock<std::mutex> lock(mutex);
  return cv.wait_for(lock, timeout, [&] { return ready; });
}

}  // namespace dopt
