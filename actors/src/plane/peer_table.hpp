#pragma once
// What this process knows about the liveness of every rank of its world,
// written by the rank actor (control plane: CAF down messages, heartbeats,
// peers' reports) and read, without locks, by the data planes' waits.
#include <algorithm>
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

  /// in_process: every rank is a thread of this process (simulation), so
  /// what the table says of a rank is exact. Across processes a silence or a
  /// cut connection may also be a partition, or a stopped process that comes
  /// back: ProcessGroup::shrink then goes ahead only on a side that holds a
  /// majority of the group (docs/fault-tolerance.md, "Who goes on").
  explicit PeerTable(int world_size, bool in_process = false)
      : states_(static_cast<std::size_t>(world_size)), in_process_(in_process) {}

  bool in_process() const noexcept { return in_process_; }

  int world_size() const noexcept { return static_cast<int>(states_.size()); }

  /// Raises rank's state to s (never lowers it); the first reason is kept,
  /// and so is the first verdict's certainty: certain when the rank's
  /// process is known gone (its connection closed, or its user code reported
  /// failure), not certain when it only fell silent (a stopped process, or a
  /// partition). Called by the rank actor (CAF thread).
  /// Returns true when the state changed.
  bool mark(int rank, State s, const std::string& why, bool certain = true) {
    if (rank < 0 || rank >= world_size()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    auto& st = states_[static_cast<std::size_t>(rank)];
    const int old = st.load(std::memory_order_relaxed);
    if (old >= s) return false;
    if (old == alive) {
      whys_.resize(states_.size());
      whys_[static_cast<std::size_t>(rank)] = why;
      suspected_.resize(states_.size());
      suspected_[static_cast<std::size_t>(rank)] = !certain;
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
  /// True when rank was declared lost on silence only (see mark); false
  /// while it is alive or when its loss is certain. Any thread.
  bool suspected(int rank) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<std::size_t>(rank) < suspected_.size() && suspected_[static_cast<std::size_t>(rank)];
  }
  /// Ranks in the order they failed or were lost.
  std::vector<int> order() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_;
  }
  /// Changes whenever a state changes (cheap check before looking closer).
  std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }

  /// Rank `rank`'s replacement (incarnation > the last one) connected to
  /// this rank and waits for a grow() to take it (the rank actor, CAF
  /// thread); the rank stays lost until revive(). Any thread may ask
  /// waiting(rank): the waiting incarnation, 0 when none.
  void announce(int rank, int incarnation) {
    if (rank < 0 || rank >= world_size()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.resize(states_.size());
    waiting_[static_cast<std::size_t>(rank)] = incarnation;
    generation_.fetch_add(1, std::memory_order_release);
  }
  int waiting(int rank) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<std::size_t>(rank) < waiting_.size() ? waiting_[static_cast<std::size_t>(rank)] : 0;
  }

  /// Rank `rank`'s replacement (incarnation > the last one) joined the job:
  /// the rank is alive again, its reasons and its place in order() are
  /// forgotten. Called by the rank actor that admitted it (CAF thread), and
  /// by the replacement itself for its own rank; false when `incarnation` is
  /// not newer than the rank's (a stale process).
  bool revive(int rank, int incarnation) {
    if (rank < 0 || rank >= world_size()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    incarnations_.resize(states_.size());
    auto& last = incarnations_[static_cast<std::size_t>(rank)];
    if (incarnation <= last) return false;
    last = incarnation;
    if (static_cast<std::size_t>(rank) < waiting_.size()) waiting_[static_cast<std::size_t>(rank)] = 0;
    if (static_cast<std::size_t>(rank) < whys_.size()) whys_[static_cast<std::size_t>(rank)].clear();
    if (static_cast<std::size_t>(rank) < suspected_.size()) suspected_[static_cast<std::size_t>(rank)] = false;
    order_.erase(std::remove(order_.begin(), order_.end(), rank), order_.end());
    states_[static_cast<std::size_t>(rank)].store(alive, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    return true;
  }
  /// How many times rank's process was replaced (0: its first process). Any thread.
  int incarnation(int rank) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<std::size_t>(rank) < incarnations_.size() ? incarnations_[static_cast<std::size_t>(rank)] : 0;
  }

  /// This rank was removed from the job: a peer that had declared it lost
  /// heard from it again (it had been stopped, or cut off) and told it so.
  /// Called by the rank actor; the first reason is kept;
  /// ProcessGroup::shrink (user thread) refuses from then on.
  void fence(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fenced_.empty()) fenced_ = why;
  }
  /// Why this rank was removed ("" while it was not).
  std::string fenced() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return fenced_;
  }

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
  std::vector<char> suspected_;
  std::vector<int> order_;
  std::vector<int> incarnations_;
  std::vector<int> waiting_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> shutdown_{false};
  bool in_process_ = false;
  std::string fenced_;
};

/// The majority rule of ProcessGroup::shrink across processes (called by
/// shrink on the user thread; pure). alive: the members this rank sees alive
/// (itself included); suspected: the members declared lost on silence only
/// (they may be running on the other side of a partition, and shrink there).
/// Members certainly dead count for neither side. This side may go on iff it
/// is larger than the suspected side, or as large and holds the lowest rank
/// of both: two sides of one split can never both go on.
inline bool may_go_on(const std::vector<int>& alive, const std::vector<int>& suspected) {
  if (alive.size() != suspected.size()) return alive.size() > suspected.size();
  if (alive.empty()) return false;
  const int low_alive = *std::min_element(alive.begin(), alive.end());
  return std::none_of(suspected.begin(), suspected.end(), [&](int r) { return r < low_alive; });
}

}  // namespace dopt::detail
