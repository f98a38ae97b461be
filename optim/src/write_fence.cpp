#include "dopt/optim/internal/write_fence.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace dopt::detail {

namespace {

std::atomic<int> g_in_flight{0};  // copies added and not yet seen ready
std::mutex g_m;
std::vector<Future<void>> g_copies;

/// Drops the copies that are made (g_m held).
void forget_made() {
  g_copies.erase(std::remove_if(g_copies.begin(), g_copies.end(), [](const Future<void>& f) { return f.is_ready(); }),
                 g_copies.end());
  g_in_flight.store(static_cast<int>(g_copies.size()), std::memory_order_release);
}

}  // namespace

void fence_add(Future<void> copied) {
  if (!copied.valid()) return;
  std::lock_guard<std::mutex> lock(g_m);
  g_copies.push_back(std::move(copied));
  forget_made();
}

void fence_wait() {
  if (g_in_flight.load(std::memory_order_acquire) == 0) [[likely]]
    return;
  std::vector<Future<void>> copies;
  {
    std::lock_guard<std::mutex> lock(g_m);
    copies = g_copies;
  }
  for (const Future<void>& f : copies) {
    try {
      f.wait();
    } catch (...) {  // a broken promise: the Checkpointer reports what went wrong
    }
  }
  std::lock_guard<std::mutex> lock(g_m);
  forget_made();
}

}  // namespace dopt::detail
