#pragma once
// Internal to dopt_gpu: the bookkeeping of the caching device allocator,
// without CUDA (the raw allocate/free functions are given), so it is tested
// on machines without a GPU with a fake.
//
// Blocks are rounded up to 512 bytes and kept per (device, rounded size) when
// freed; an allocation of the same rounded size on the same device reuses one.
// When the raw allocation fails (returns null), the device's cached blocks go
// back to the driver and it is tried once more; a second failure is a
// DeviceError naming the size. Thread-safe.
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dopt/runtime/error.hpp"

namespace dopt::gpu::detail {

class CachingPool {
 public:
  using RawAlloc = std::function<void*(std::size_t nbytes, int device)>;  // null on out-of-memory
  using RawFree = std::function<void(void* ptr, int device)>;

  static constexpr std::size_t kRound = 512;
  static std::size_t round_up(std::size_t n) { return (n + kRound - 1) / kRound * kRound; }

  CachingPool(RawAlloc alloc, RawFree free) : raw_alloc_(std::move(alloc)), raw_free_(std::move(free)) {}

  void* allocate(std::size_t nbytes, int device) {
    if (nbytes == 0) return nullptr;
    const std::size_t r = round_up(nbytes);
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto& pool = free_[{device, r}];
      if (!pool.empty()) {
        void* p = pool.back();
        pool.pop_back();
        Counts& c = counts_[device];
        c.cached -= r;
        c.in_use += r;
        ++c.reused;
        return p;
      }
    }
    void* p = raw_alloc_(r, device);
    if (!p) {
      release(device);
      p = raw_alloc_(r, device);
    }
    if (!p)
      throw DeviceError("allocate", "out of memory allocating " + std::to_string(nbytes) + " bytes on cuda:" +
                                        std::to_string(device));
    std::lock_guard<std::mutex> g(mutex_);
    Counts& c = counts_[device];
    c.in_use += r;
    ++c.raw_allocs;
    return p;
  }

  void deallocate(void* ptr, std::size_t nbytes, int device) noexcept {
    if (!ptr) return;
    const std::size_t r = round_up(nbytes);
    std::lock_guard<std::mutex> g(mutex_);
    free_[{device, r}].push_back(ptr);
    Counts& c = counts_[device];
    c.in_use -= r;
    c.cached += r;
  }

  /// Returns the cached blocks of `device` (-1: every device) to the driver.
  void release(int device = -1) {
    std::vector<std::pair<void*, int>> out;
    {
      std::lock_guard<std::mutex> g(mutex_);
      for (auto& [key, blocks] : free_) {
        if (device >= 0 && key.first != device) continue;
        for (void* p : blocks) out.emplace_back(p, key.first);
        counts_[key.first].cached -= key.second * blocks.size();
        blocks.clear();
      }
    }
    for (auto& [p, d] : out) raw_free_(p, d);
  }

  struct Counts {
    std::size_t in_use = 0;   // bytes handed out (rounded)
    std::size_t cached = 0;   // bytes freed and kept for reuse
    std::size_t raw_allocs = 0;
    std::size_t reused = 0;
  };
  Counts counts(int device) const {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = counts_.find(device);
    return it == counts_.end() ? Counts{} : it->second;
  }

 private:
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mutex_;
  std::map<std::pair<int, std::size_t>, std::vector<void*>> free_;
  std::map<int, Counts> counts_;
};

}  // namespace dopt::gpu::detail
