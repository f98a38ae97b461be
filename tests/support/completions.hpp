#pragma once
// Test helpers for code that reports through completion callbacks (the TCP
// mesh, the ring collectives): a bounded collector of completions, and what
// a test asks of an exception_ptr.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace dopt::testing {

/// Collects completions in the order they run; wait() blocks until every
/// callback handed out by cb() has run, bounded so that a hang fails the test
/// (REQUIRE) instead of stalling it.
class Waiter {
 public:
  std::function<void(std::exception_ptr)> cb() {
    {
      std::lock_guard<std::mutex> l(m_);
      ++expected_;
    }
    return [this](std::exception_ptr e) {
      std::lock_guard<std::mutex> l(m_);
      errors_.push_back(e);
      cv_.notify_all();
    };
  }
  /// cb() for a caller that numbers its callbacks: wait_by_slot() gives
  /// this one's error at index slot.
  std::function<void(std::exception_ptr)> cb(std::size_t slot) {
    {
      std::lock_guard<std::mutex> l(m_);
      if (by_slot_.size() <= slot) by_slot_.resize(slot + 1);
    }
    return [this, slot, done = cb()](std::exception_ptr e) {
      {
        std::lock_guard<std::mutex> l(m_);
        by_slot_[slot] = e;
      }
      done(e);
    };
  }
  std::vector<std::exception_ptr> wait(std::chrono::seconds bound = std::chrono::seconds(60)) {
    std::unique_lock<std::mutex> l(m_);
    const bool ok = cv_.wait_for(l, bound, [&] { return errors_.size() >= expected_; });
    REQUIRE(ok);
    return errors_;
  }
  /// wait(), then the errors of the numbered callbacks by slot.
  std::vector<std::exception_ptr> wait_by_slot(std::chrono::seconds bound = std::chrono::seconds(60)) {
    wait(bound);
    std::lock_guard<std::mutex> l(m_);
    return by_slot_;
  }
  /// wait(), then rethrows the first error.
  void wait_ok(std::chrono::seconds bound = std::chrono::seconds(60)) {
    for (auto& e : wait(bound))
      if (e) std::rethrow_exception(e);
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::size_t expected_ = 0;
  std::vector<std::exception_ptr> errors_;   // in the order the callbacks ran
  std::vector<std::exception_ptr> by_slot_;  // of cb(slot)'s callbacks
};

/// e's what() ("" when it is not a std::exception).
inline std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
  }
  return {};
}

/// Whether e holds an E (or a subclass).
template <class E>
bool is(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace dopt::testing
