#pragma once
// What this process knows about the liveness of every rank of its world,
// written by the rank actor (control plane: CAF down messages, heartbeats,
// peers' reports) and read, without locks, by the data planes' waits.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dopt::detail {

class PeerTable {
 public:
  enum State : int {
    alive = 0,
    /// The rank's user code failed: it submits nothing more, but what it
    /// already submitted still runs (its executors keep going).
    failed = 1,
    /// The rank is gone (process died, stopped, cut off; or shut down): it
    /// finishes nothing.
    lost = 2,
  };

  explicit PeerTable(int world_size) : states_(static_cast<std::size_t>(world_size)) {}

  int world_size() const noexcept { return static_cast<int>(states_.size()); }

  /// Raises rank's state to s (never lowers it); the first reason is kept.
  /// Returns true when the state changed.
  bool mark(int rank, State s, const std::string& why) {
    if (rank < 0 || rank >= world_size()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    auto& st = states_[static_cast<std::size_t>(rank)];
    const int old = st.load(std::memory_order_relaxed);
    if (old >= s) return false;
    if (old == alive) {
      whys_.resize(states_.size());
      whys_[static_cast<std::size_t>(rank)] = why;
      order_.push_back(rank);
    }
    st.store(s, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    return true;
  }

  State state(int rank) const noexcept {
    return static_cast<State>(states_[static_cast<std::size_t>(rank)].load(std::memory_order_acquire));
  }
  std::string why(int rank) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<std::size_t>(rank) < whys_.size() ? whys_[static_cast<std::size_t>(rank)] : std::string();
  }
  /// Ranks in the order they failed or were lost.
  std::vector<int> order() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_;
  }
  /// Changes whenever a state changes (cheap check before looking closer).
  std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }

  /// The runtime is shutting down: every wait ends with StateError.
  void shut_down() noexcept {
    shutdown_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
  }
  bool shutting_down() const noexcept { return shutdown_.load(std::memory_order_acquire); }

 private:
  std::vector<std::atomic<int>> states_;
  mutable std::mutex mutex_;
  std::vector<std::string> whys_;
  std::vector<int> order_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> shutdown_{false};
};

}  // namespace dopt::detail
