// BufferPool: a free list of host buffers by capacity.
#include "dopt/runtime/internal/buffer_pool.hpp"

#include <iterator>
#include <map>
#include <mutex>
#include <new>

#include "dopt/runtime/tensor.hpp"

namespace dopt {

struct BufferPool::State {
  BufferPoolOptions opts;
  mutable std::mutex m;
  std::multimap<std::size_t, std::byte*> free;
  std::size_t free_bytes = 0;

  static std::byte* allocate(std::size_t n) {
    return static_cast<std::byte*>(allocator_for(DeviceType::CPU).allocate(n, Device()));
  }
  static void deallocate(std::byte* p, std::size_t n) noexcept {
    allocator_for(DeviceType::CPU).deallocate(p, n, Device());
  }
  // Called with m held: drops the largest free buffers until `room` more fit.
  void make_room(std::size_t room) {
    while (!free.empty() && free_bytes + room > opts.max_bytes) {
      auto last = std::prev(free.end());
      free_bytes -= last->first;
      deallocate(last->second, last->first);
      free.erase(last);
    }
  }
  void put(std::byte* p, std::size_t cap) noexcept {
    if (cap >= opts.min_bytes && cap <= opts.max_bytes) {
      std::lock_guard<std::mutex> lk(m);
      make_room(cap);
      free.emplace(cap, p);
      free_bytes += cap;
      return;
    }
    deallocate(p, cap);
  }
  ~State() {
    for (auto& [cap, p] : free) deallocate(p, cap);
  }
};

BufferPool::Lease::Lease(Lease&& o) noexcept : pool_(std::move(o.pool_)), data_(o.data_), cap_(o.cap_) {
  o.data_ = nullptr;
  o.cap_ = 0;
}

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::move(o.pool_);
    data_ = o.data_;
    cap_ = o.cap_;
    o.data_ = nullptr;
    o.cap_ = 0;
  }
  return *this;
}

BufferPool::Lease::~Lease() { release(); }

void BufferPool::Lease::release() noexcept {
  if (data_) pool_->put(data_, cap_);
  data_ = nullptr;
  cap_ = 0;
  pool_.reset();
}

BufferPool::BufferPool(BufferPoolOptions options) : state_(std::make_shared<State>()) { state_->opts = options; }

BufferPool::~BufferPool() = default;

BufferPool::Lease BufferPool::take(std::size_t n) {
  Lease l;
  if (n == 0) return l;
  l.pool_ = state_;
  if (n >= state_->opts.min_bytes) {
    std::lock_guard<std::mutex> lk(state_->m);
    auto it = state_->free.lower_bound(n);
    if (it != state_->free.end() && it->first / 2 <= n) {
      l.cap_ = it->first;
      l.data_ = it->second;
      state_->free_bytes -= it->first;
      state_->free.erase(it);
      return l;
    }
  }
  l.data_ = State::allocate(n);
  l.cap_ = n;
  return l;
}

std::size_t BufferPool::free_bytes() const {
  std::lock_guard<std::mutex> lk(state_->m);
  return state_->free_bytes;
}

void BufferPool::trim() {
  std::lock_guard<std::mutex> lk(state_->m);
  for (auto& [cap, p] : state_->free) State::deallocate(p, cap);
  state_->free.clear();
  state_->free_bytes = 0;
}

}  // namespace dopt
