#include "dopt/runtime/internal/parallel.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dopt {

int hardware_threads() noexcept {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {

thread_local bool t_inside_pool = false;  // set while a thread runs pool items

// One job at a time; workers pull item indices from an atomic counter.
class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  void run(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn) {
    std::lock_guard<std::mutex> job_lock(job_mutex_);  // serialise concurrent callers
    ensure_workers(threads - 1);
    std::exception_ptr error;
    std::mutex error_mutex;
    std::atomic<std::int64_t> next{0};
    auto body = [&] {
      const bool was_inside = t_inside_pool;
      t_inside_pool = true;
      struct Reset {
        bool v;
        ~Reset() { t_inside_pool = v; }
      } reset{was_inside};
      for (;;) {
        const std::int64_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= n) break;
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> g(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
    };
    const int helpers = threads - 1;
    const std::function<void()> job_fn = body;
    {
      std::lock_guard<std::mutex> g(mutex_);
      job_ = &job_fn;
      pending_ = helpers;
      wanted_ = helpers;
      ++generation_;
    }
    cv_.notify_all();
    job_fn();
    std::unique_lock<std::mutex> g(mutex_);
    done_cv_.wait(g, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error) std::rethrow_exception(error);
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> g(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void ensure_workers(int count) {
    std::lock_guard<std::mutex> g(mutex_);
    while (static_cast<int>(workers_.size()) < count) {
      const int id = static_cast<int>(workers_.size());
      workers_.emplace_back([this, id] { loop(id); });
    }
  }

  void loop(int id) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> g(mutex_);
    for (;;) {
      cv_.wait(g, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= wanted_) continue;
      auto* job = job_;
      g.unlock();
      (*job)();
      g.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex job_mutex_;
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void()>* job_ = nullptr;
  int pending_ = 0;
  int wanted_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace

void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  if (threads > n) threads = static_cast<int>(n);
  // More threads than cores only adds switching; a nested call runs inline
  // (the pool runs one job at a time, so waiting for it from inside would deadlock).
  threads = std::min(threads, std::max(1, hardware_threads()));
  if (threads <= 1 || t_inside_pool) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Pool::instance().run(n, threads, fn);
}

}  // namespace dopt
