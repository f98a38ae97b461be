#pragma once
// A value that counts its live instances, for the tests of object lifetimes
// across processes and threads (an RRef's value lives until its last holder
// lets go): struct Tracked : LiveCounted<Tracked> { using LiveCounted::LiveCounted; };
// Tracked::live is read by the test thread once the ranks have settled.
#include <atomic>

namespace dopt::testing {

template <class Derived>
struct LiveCounted {
  static inline std::atomic<int> live{0};
  int value = 0;
  LiveCounted() { ++live; }
  explicit LiveCounted(int v) : value(v) { ++live; }
  LiveCounted(const LiveCounted& o) : value(o.value) { ++live; }
  LiveCounted(LiveCounted&& o) noexcept : value(o.value) { ++live; }
  LiveCounted& operator=(const LiveCounted&) = default;
  ~LiveCounted() { --live; }
};

}  // namespace dopt::testing
