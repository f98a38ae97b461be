#pragma once
// BufferPool: host buffers kept for reuse by transports and collectives that
// need scratch memory per message or per call.
//
// Why: memory written for the first time costs a page fault per 4 KiB page
// (about 10 us each on the 2-CPU machines dopt is measured on), so a 1 MiB
// scratch buffer allocated per call can cost several times the transfer it
// serves. A pool hands back a buffer used before.
//
// Contract: take() and the leases' destructors may be called from any
// thread (a mutex guards the free list). A lease owns its buffer until it is
// destroyed or moved from; the pool's free list lives as long as the pool or
// its last lease, whichever is later. Buffers come from the CPU allocator
// (tensor.hpp: 2 MiB blocks and up on transparent huge pages). Contents of a
// taken buffer are unspecified.
#include <cstddef>
#include <memory>

namespace dopt {

struct BufferPoolOptions {
  /// Buffers smaller than this are allocated and freed as usual (the heap
  /// keeps them warm).
  std::size_t min_bytes = std::size_t(64) << 10;
  /// At most this many bytes of free buffers are kept (the largest go first
  /// when a returned buffer would exceed it); 0 keeps none.
  std::size_t max_bytes = std::size_t(64) << 20;
};

class BufferPool {
  struct State;

 public:
  /// A buffer of at least the size asked for; goes back to its pool when destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    std::byte* get() const noexcept { return data_; }
    /// The buffer's capacity (at least the size asked for; at most twice it).
    std::size_t capacity() const noexcept { return cap_; }
    explicit operator bool() const noexcept { return data_ != nullptr; }

   private:
    friend class BufferPool;
    void release() noexcept;
    std::shared_ptr<State> pool_;
    std::byte* data_ = nullptr;
    std::size_t cap_ = 0;
  };

  explicit BufferPool(BufferPoolOptions options = {});
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// A buffer of at least n bytes: the smallest free one that fits and is at
  /// most twice n, else a new one. n == 0: an empty lease. Throws
  /// std::bad_alloc when memory runs out.
  Lease take(std::size_t n);
  /// Bytes of free buffers kept now.
  std::size_t free_bytes() const;
  /// Frees every kept buffer (leases out stay valid and return later).
  void trim();

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dopt
