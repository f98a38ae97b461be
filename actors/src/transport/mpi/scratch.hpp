#pragma once
// The MPI plane's per-call scratch buffers. Internal to transport/mpi.
//
// A call's Scratch takes its buffer from the plane's ScratchPool (reused:
// fresh memory faults in every page) and gives it back when the call ends.
// A call that ends by an exception (a failed wait) may leave MPI requests
// behind that still write the buffer (MPI cannot cancel a collective), so
// its buffer goes to the quarantine instead and is never reused.
// Threads: a Scratch belongs to its call's thread; the pool and the
// quarantine may be used from any thread.
#include <cstddef>
#include <exception>
#include <mutex>
#include <vector>

#include "dopt/runtime/internal/buffer_pool.hpp"

namespace dopt::detail::mpi {

struct ScratchPool {
  BufferPool buffers;
  /// Bytes of the buffers in quarantine.
  std::size_t quarantined_bytes() const {
    std::lock_guard<std::mutex> lock(mutex);
    std::size_t n = 0;
    for (const auto& l : quarantine) n += l.capacity();
    return n;
  }
  void quarantine_lease(BufferPool::Lease l) {
    std::lock_guard<std::mutex> lock(mutex);
    quarantine.push_back(std::move(l));
  }

 private:
  mutable std::mutex mutex;
  std::vector<BufferPool::Lease> quarantine;
};

/// A call's scratch buffer, grown on demand.
class Scratch {
 public:
  explicit Scratch(ScratchPool& pool) : pool_(pool), exceptions_(std::uncaught_exceptions()) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (lease_ && std::uncaught_exceptions() > exceptions_) pool_.quarantine_lease(std::move(lease_));
  }
  /// At least n bytes (contents unspecified; kept from the previous size when it fits).
  char* get(std::size_t n) {
    if (lease_.capacity() < n) lease_ = pool_.buffers.take(n);
    return reinterpret_cast<char*>(lease_.get());
  }

 private:
  ScratchPool& pool_;
  int exceptions_;
  BufferPool::Lease lease_;
};

}  // namespace dopt::detail::mpi
