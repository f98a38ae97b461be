#pragma once
// A small persistent worker pool for data-parallel loops over independent
// items (used by the multi-tensor optimizer path). parallel_for blocks the
// calling thread until every item is done; the caller's thread takes part.
#include <cstdint>
#include <functional>

namespace dopt {

/// Runs fn(i) for i in [0, n) on up to `threads` threads (1 = inline, in order).
/// An exception from any fn is rethrown in the caller after all items ran.
void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn);
/// Hardware threads available to this process (at least 1): the CPUs of its
/// affinity mask (taskset, cgroup cpusets), else std::thread::hardware_concurrency().
int hardware_threads() noexcept;

}  // namespace dopt
