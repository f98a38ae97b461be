#pragma once
// What the members of one group share when they are threads of one process
// (simulated ranks: LocalDirectory), beside their regions: a tree of their
// steps, whose root is the least step of all members, so that a wait for
// every member reads one word instead of every member's step word; the last
// round whose descriptors a member found all alike, so that the others need
// not compare them again; and how many members aborted the group, so that
// while none did nobody reads every member's abort line. Between processes
// there is none.
//
// Threads: every member's thread updates and reads it at once (lock-free).
// Each member writes only its own leaf; inner nodes only grow, to the least
// of their children as the writer saw them (a writer reads its sibling after
// its own write, so of two writers at once the later sees both).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

namespace dopt::detail::shm_plane {

class Board {
 public:
  explicit Board(int n) : n_(n) {
    while (leaves_ < n) leaves_ *= 2;
    tree_ = std::make_unique<std::atomic<std::uint64_t>[]>(2 * static_cast<std::size_t>(leaves_));
    // Leaves past the last member never hold anyone back.
    for (std::size_t i = static_cast<std::size_t>(leaves_ + n); i < 2 * static_cast<std::size_t>(leaves_); ++i)
      tree_[i].store(std::numeric_limits<std::uint64_t>::max(), std::memory_order_relaxed);
    for (std::size_t i = static_cast<std::size_t>(leaves_) - 1; i >= 1; --i)
      tree_[i].store(std::min(tree_[2 * i].load(std::memory_order_relaxed), tree_[2 * i + 1].load(std::memory_order_relaxed)),
                     std::memory_order_relaxed);
  }

  int size() const noexcept { return n_; }

  /// Member g (on its own thread, after it stored its step) reached `step`.
  void reached(int g, std::uint64_t step) noexcept {
    std::size_t i = static_cast<std::size_t>(leaves_ + g);
    raise(tree_[i], step);
    for (i /= 2; i >= 1; i /= 2)
      raise(tree_[i], std::min(tree_[2 * i].load(std::memory_order_seq_cst), tree_[2 * i + 1].load(std::memory_order_seq_cst)));
  }
  /// The least step of all members: never more than any member's, and
  /// equal to it once the updates under way ended.
  std::uint64_t least() const noexcept { return tree_[1].load(std::memory_order_acquire); }

  /// Some member found every member's descriptor of `round` alike.
  bool matched(std::uint64_t round) const noexcept { return matched_.load(std::memory_order_acquire) == round + 1; }
  void set_matched(std::uint64_t round) noexcept { raise(matched_, round + 1); }

  /// A member set its abort line (after setting it).
  void aborted() noexcept { aborts_.fetch_add(1, std::memory_order_acq_rel); }
  /// Members that aborted the group so far.
  std::uint64_t aborts() const noexcept { return aborts_.load(std::memory_order_acquire); }

 private:
  static void raise(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
    std::uint64_t cur = a.load(std::memory_order_seq_cst);
    while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_seq_cst)) {
    }
  }

  int n_;
  int leaves_ = 1;
  std::unique_ptr<std::atomic<std::uint64_t>[]> tree_;  // [1]: root; [leaves_ + g]: member g
  std::atomic<std::uint64_t> matched_{0};                // round + 1
  std::atomic<std::uint64_t> aborts_{0};
};

}  // namespace dopt::detail::shm_plane
