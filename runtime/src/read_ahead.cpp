#include "dopt/runtime/internal/read_ahead.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "dopt/runtime/internal/parallel.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace dopt::detail {

void populate_pages(void* p, std::size_t n) noexcept {
  constexpr std::uintptr_t kPage = 4096;
  if (n < 16 * kPage) return;
  const auto lo = (reinterpret_cast<std::uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const auto hi = (reinterpret_cast<std::uintptr_t>(p) + n) & ~(kPage - 1);
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
}

namespace {

constexpr std::size_t kAheadAtLeast = std::size_t{8} << 20;

/// Which destinations have been claimed for mapping, in order.
class MapQueue {
 public:
  explicit MapQueue(const std::vector<std::pair<std::string, Tensor>>& items) : items_(items) {}

  /// The helper's loop: claims and maps the next destination until none is left or stop().
  void run_helper() {
    while (!stop_.load(std::memory_order_relaxed)) {
      const std::size_t j = next_.fetch_add(1, std::memory_order_relaxed);
      if (j >= items_.size()) return;
      map(j);
    }
  }

  /// The reader, before reading item k: claims (and maps) the items up to k
  /// that the helper has not begun. It does not wait for one the helper is
  /// mapping: read_into maps its destination too, so on a busy machine a
  /// helper that is not running does not hold the reader up.
  void claim_up_to(std::size_t k) {
    std::size_t j = next_.load(std::memory_order_relaxed);
    while (j <= k)
      if (next_.compare_exchange_weak(j, j + 1, std::memory_order_relaxed)) {
        map(j);
        j = next_.load(std::memory_order_relaxed);
      }
  }

  void stop() { stop_.store(true, std::memory_order_relaxed); }

 private:
  void map(std::size_t j) const {
    const Tensor& t = items_[j].second;
    if (t.defined() && t.device().is_cpu()) populate_pages(t.data_ptr(), t.nbytes());
  }

  const std::vector<std::pair<std::string, Tensor>>& items_;
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace

void read_into_all(SafetensorsReader& rd, const std::vector<std::pair<std::string, Tensor>>& items) {
  std::size_t bytes = 0;
  for (const auto& [name, t] : items)
    if (t.defined()) bytes += t.nbytes();
  if (bytes < kAheadAtLeast || hardware_threads() < 2) {
    for (const auto& [name, t] : items) rd.read_into(name, t);
    return;
  }
  MapQueue queue(items);
  std::thread helper([&queue] { queue.run_helper(); });
  struct Join {
    MapQueue& q;
    std::thread& t;
    ~Join() {
      q.stop();
      t.join();
    }
  } join{queue, helper};
  for (std::size_t k = 0; k < items.size(); ++k) {
    queue.claim_up_to(k);
    rd.read_into(items[k].first, items[k].second);
  }
}

}  // namespace dopt::detail
