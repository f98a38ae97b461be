#pragma once
// Checks from rank threads, and a multi-rank fixture, for dopt's own tests.
//
// Catch2 2.x assertions are not thread-safe. A rank thread therefore either
//  - asserts under one process-wide lock with RANK_CHECK(...) and friends, or
//  - records what it saw in a RankLog, which the test thread reports once the
//    ranks have ended (log.report()): every failure becomes a FAIL_CHECK.
// for_world_sizes() runs one multi-rank scenario at each world size, with the
// size in every failure's context.
#include <catch2/catch.hpp>

#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>


namespace dopt::testing {

/// The lock every RANK_CHECK takes.
inline std::mutex& catch_mutex() {
  static std::mutex m;
  return m;
}

/// Failures recorded from any thread; the test thread reports them.
class RankLog {
 public:
  /// Counts one check; keeps `what` when it failed (the first `max_kept`).
  void check(bool ok, const std::string& what) {
    std::lock_guard<std::mutex> l(mutex_);
    ++checks_;
    if (!ok) {
      ++failures_;
      if (errors_.size() < max_kept) errors_.push_back(what);
    }
  }
  /// Records a failure.
  void fail(const std::string& what) { check(false, what); }
  /// Records a failure seen on `rank`.
  void fail(int rank, const std::string& what) { fail("rank " + std::to_string(rank) + ": " + what); }

  long checks() const {
    std::lock_guard<std::mutex> l(mutex_);
    return checks_;
  }
  long failures() const {
    std::lock_guard<std::mutex> l(mutex_);
    return failures_;
  }
  std::vector<std::string> errors() const {
    std::lock_guard<std::mutex> l(mutex_);
    return errors_;
  }
  /// On the test thread, after the ranks ended: one FAIL_CHECK per kept
  /// failure, then CHECK that there were none.
  void report() const {
    for (const auto& e : errors()) FAIL_CHECK(e);
    CHECK(failures() == 0);
  }

  static constexpr std::size_t max_kept = 20;

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> errors_;
  long checks_ = 0;
  long failures_ = 0;
};

/// Runs fn(world_size) for each size, with the size as Catch's context.
inline void for_world_sizes(std::initializer_list<int> sizes, const std::function<void(int)>& fn) {
  for (int n : sizes) {
    INFO("world size " << n);
    fn(n);
  }
}

}  // namespace dopt::testing

/// Catch2 assertions from any thread (under dopt::testing::catch_mutex()).
#define RANK_CHECK(...)                                                \
  do {                                                                 \
    std::lock_guard<std::mutex> dopt_rank_lock_(::dopt::testing::catch_mutex()); \
    CHECK(__VA_ARGS__);                                                \
  } while (0)
#define RANK_CHECK_FALSE(...)                                          \
  do {                                                                 \
    std::lock_guard<std::mutex> dopt_rank_lock_(::dopt::testing::catch_mutex()); \
    CHECK_FALSE(__VA_ARGS__);                                          \
  } while (0)
#define RANK_CHECK_THAT(arg, matcher)                                  \
  do {                                                                 \
    std::lock_guard<std::mutex> dopt_rank_lock_(::dopt::testing::catch_mutex()); \
    CHECK_THAT(arg, matcher);                                          \
  } while (0)
#define RANK_CHECK_THROWS_AS(expr, type)                               \
  do {                                                                 \
    std::lock_guard<std::mutex> dopt_rank_lock_(::dopt::testing::catch_mutex()); \
    CHECK_THROWS_AS(expr, type);                                       \
  } while (0)
