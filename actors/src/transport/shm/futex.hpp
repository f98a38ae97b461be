#pragma once
// Linux futex wait/wake on a 32-bit word, private (threads of one process) or
// shared (a word in memory mapped by several processes).
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>

namespace dopt::detail::shm_plane {

/// Sleeps while *word == expected, for at most `timeout` (spurious wake-ups
/// allowed). Callers re-check their condition.
inline void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::chrono::microseconds timeout,
                       bool shared) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  const int op = shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE;
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, expected, &ts, nullptr, 0);
}

/// Wakes every thread sleeping on word.
inline void futex_wake_all(std::atomic<std::uint32_t>* word, bool shared) {
  const int op = shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE;
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace dopt::detail::shm_plane
