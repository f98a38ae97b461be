#pragma once
// Internal (not installed): a mutex for code that RPC agents serve, used by
// dopt::rpc's tests and distributed/'s DistributedOptimizer. Any thread may
// lock it, also one that a served function runs on.
#include <atomic>
#include <mutex>
#include <optional>

#include "dopt/actors/internal/sim_hooks.hpp"

namespace dopt::rpc::detail {

/// A mutex that a function served by an agent may hold across an RPC call
/// or a future wait: in deterministic rpc::simulate a thread that waits for
/// it gives the scheduler's baton up instead of blocking the thread that
/// holds it. Otherwise a std::mutex.
class ServedMutex {
 public:
  void lock() {
    if (::dopt::detail::sim::active()) [[unlikely]]
      ::dopt::detail::sim::block([this] { return !held_.load(std::memory_order_acquire); }, std::nullopt,
                                 "rpc mutex");
    m_.lock();
    held_.store(true, std::memory_order_release);
  }
  void unlock() {
    held_.store(false, std::memory_order_release);
    m_.unlock();
  }

 private:
  std::mutex m_;
  std::atomic<bool> held_{false};
};

}  // namespace dopt::rpc::detail
