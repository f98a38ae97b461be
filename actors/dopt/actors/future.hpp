#pragma once
// dopt::Future<T> / dopt::Promise<T>: the result of an asynchronous runtime
// operation (a collective, a send, a recv).
//
// A Future is a shared handle to one result slot. The slot is filled exactly
// once, by the Promise, either with a value or with an exception (normally a
// dopt::Error subclass: TimeoutError, PeerLostError, CollectiveMismatchError,
// ...). Contract:
//   * wait() blocks the calling thread until the slot is filled. Runtime
//     operations always fill their slot: on success, on error, when their
//     group's timeout expires, or when the Runtime shuts down, so wait() does
//     not block forever on a runtime-made future.
//   * get() waits, then returns the value or rethrows the carried exception.
//     get() may be called any number of times, from any thread.
//   * is_ready() never blocks.
//   * then(f) registers f(Future<T>) to run once the slot is filled, and
//     returns a Future for f's result (an exception thrown by f lands in it).
//     f runs on the thread that fills the slot (for runtime operations: a CAF
//     worker thread), or immediately on the caller's thread when the slot is
//     already filled. Keep f short and never block in it (in particular do not
//     wait on another collective from inside f).
// A default-constructed Future is invalid (valid() == false); using it throws
// dopt::StateError.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dopt/runtime/error.hpp"

namespace dopt {

template <class T> class Future;
template <class T> class Promise;

/// The part of a Future's result slot that does not depend on T: its lock,
/// whether it is filled, the continuations to run then, and the waits for
/// it. Only Future and Promise use it (everything is private). The waits
/// are out of line: under the deterministic simulation (simulate with
/// deterministic = true) they are scheduling points.
class FutureSlot {
  template <class> friend class Future;
  template <class> friend class Promise;

 protected:
  FutureSlot() = default;

 private:

  /// Runs fill() and marks the slot filled unless it already was; then wakes
  /// the waiters and runs the continuations (on this thread). False: it was.
  template <class Fill>
  bool fill(Fill&& f) {
    std::vector<std::function<void()>> cbs;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (ready) return false;
      f();
      ready = true;
      cbs.swap(callbacks);
    }
    cv.notify_all();
    for (auto& cb : cbs) cb();
    return true;
  }
  bool is_ready() {
    std::lock_guard<std::mutex> lock(mutex);
    return ready;
  }
  /// Blocks until filled.
  void wait();
  /// Blocks until filled or `timeout` passed; returns whether filled.
  bool wait_for(std::chrono::nanoseconds timeout);

  std::mutex mutex;
  std::condition_variable cv;
  bool ready = false;
  std::vector<std::function<void()>> callbacks;
};

template <class T>
class Future {
 public:
  using value_type = T;
  Future() = default;

  bool valid() const noexcept { return state_ != nullptr; }

  bool is_ready() const { return state("Future.is_ready").is_ready(); }

  void wait() const { state("Future.wait").wait(); }

  /// Waits at most `timeout`; returns whether the result is there.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    auto& s = state("Future.wait_for");
    // Longer than a century waits as long as a century (no overflow in nanoseconds).
    constexpr std::chrono::duration<double> longest(3.2e9);
    if (std::chrono::duration<double>(timeout) > longest)
      return s.wait_for(std::chrono::duration_cast<std::chrono::nanoseconds>(longest));
    return s.wait_for(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
  }

  /// Waits, then returns the value or rethrows the carried exception.
  T get() const {
    wait();
    auto& s = *state_;
    if (s.error) std::rethrow_exception(s.error);
    if constexpr (!std::is_void_v<T>) return *s.value;
  }

  /// The carried exception (null while not ready or on success).
  std::exception_ptr exception() const {
    auto& s = state("Future.exception");
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.error;
  }

  /// Runs f(*this) once ready; returns a Future for f's result (see header).
  template <class F>
  auto then(F&& f) const -> Future<std::invoke_result_t<F, Future<T>>> {
    using R = std::invoke_result_t<F, Future<T>>;
    auto& s = state("Future.then");
    Promise<R> next;
    Future<R> result = next.get_future();
    auto run = [self = *this, fn = std::forward<F>(f), next]() mutable {
      try {
        if constexpr (std::is_void_v<R>) {
          fn(self);
          next.set_value();
        } else {
          next.set_value(fn(self));
        }
      } catch (...) {
        next.set_exception(std::current_exception());
      }
    };
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      if (!s.ready) {
        s.callbacks.emplace_back(std::move(run));
        return result;
      }
    }
    run();
    return result;
  }

 private:
  friend class Promise<T>;
  /// The slot with its value or exception.
  struct State : FutureSlot {
    std::optional<std::conditional_t<std::is_void_v<T>, std::monostate, T>> value;
    std::exception_ptr error;
  };
  explicit Future(std::shared_ptr<State> s) : state_(std::move(s)) {}
  State& state(const char* op) const {
    if (!state_) throw StateError(op, "the future is invalid (default-constructed)");
    return *state_;
  }
  std::shared_ptr<State> state_;
};

/// The writing end of a Future. Copies share the slot; the first fill wins,
/// later fills are ignored (and return false).
template <class T>
class Promise {
 public:
  Promise() : state_(std::make_shared<State>()) {}

  Future<T> get_future() const { return Future<T>(state_); }

  template <class U = T>
    requires(!std::is_void_v<U>)
  bool set_value(U value) const {
    return state_->fill([&] { state_->value.emplace(std::move(value)); });
  }
  bool set_value() const
    requires std::is_void_v<T>
  {
    return state_->fill([&] { state_->value.emplace(); });
  }
  bool set_exception(std::exception_ptr e) const {
    return state_->fill([&] { state_->error = std::move(e); });
  }
  bool is_filled() const { return state_->is_ready(); }

 private:
  using State = typename Future<T>::State;
  std::shared_ptr<State> state_;
};

/// Waits for f and, when it failed and `first` holds no error yet, keeps its
/// error in `first`. For waiting on every future of a batch (no work left
/// running), then rethrowing the first failure.
template <class T>
void wait_keeping_first_error(const Future<T>& f, std::exception_ptr& first) noexcept {
  try {
    f.get();
  } catch (...) {
    if (!first) first = std::current_exception();
  }
}

/// A future that is already filled with a value.
template <class T>
Future<T> make_ready_future(T value) {
  Promise<T> p;
  p.set_value(std::move(value));
  return p.get_future();
}
inline Future<void> make_ready_future() {
  Promise<void> p;
  p.set_value();
  return p.get_future();
}
/// A future that is already filled with an exception.
template <class T = void>
Future<T> make_failed_future(std::exception_ptr e) {
  Promise<T> p;
  p.set_exception(std::move(e));
  return p.get_future();
}

/// A future that completes once every future of `futures` has completed
/// (it always waits for all of them, also after one failed, so no work of
/// the batch is left running when it completes). It carries a value when
/// all succeeded; when several failed it carries the error of the first
/// failed future in list order (not the first to fail in time, so the
/// result does not depend on scheduling). An empty list gives a ready
/// future. The combined future is filled on the thread that completes the
/// last of them (see then()).
template <class T>
Future<void> when_all(const std::vector<Future<T>>& futures) {
  if (futures.empty()) return make_ready_future();
  struct Shared {
    std::mutex m;
    std::size_t left;
    std::vector<std::exception_ptr> errors;
    Promise<void> done;
  };
  auto s = std::make_shared<Shared>();
  s->left = futures.size();
  s->errors.resize(futures.size());
  for (std::size_t i = 0; i < futures.size(); ++i) {
    (void)futures[i].then([s, i](const Future<T>& f) {
      bool last = false;
      {
        std::lock_guard<std::mutex> lock(s->m);
        s->errors[i] = f.exception();
        last = --s->left == 0;
      }
      if (!last) return;
      for (auto& e : s->errors)
        if (e) {
          s->done.set_exception(e);
          return;
        }
      s->done.set_value();
    });
  }
  return s->done.get_future();
}

}  // namespace dopt
