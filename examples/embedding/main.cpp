// Embedding dopt in a program that has its own threads: the program keeps its
// thread pool and its event loop; dopt adds a Runtime limited to 2 threads.
// A pool thread starts 4 simulated ranks on that runtime; the ranks post
// asynchronous all_reduces and hand the results to the program's event loop
// with Future::then(), so the event loop never blocks on dopt and keeps
// serving its own events (here: timer ticks) while the collectives run.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dopt/actors/runtime.hpp"
#include "dopt/actors/simulate.hpp"

using dopt::Tensor;

namespace {

/// The program's event loop: runs posted tasks on the thread that calls run().
class EventLoop {
 public:
  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  void stop() {
    post([this] { running_ = false; });
  }
  /// Runs tasks until stop(); calls on_idle every `tick` without a task.
  void run(std::chrono::milliseconds tick, const std::function<void()>& on_idle) {
    while (running_) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!cv_.wait_for(lock, tick, [&] { return !tasks_.empty(); })) {
        lock.unlock();
        on_idle();
        continue;
      }
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = true;  // only touched on the loop's thread
};

/// The program's thread pool (fixed size, FIFO).
class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void work() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return done_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool done_ = false;
};

}  // namespace

int main() {
  // The Runtime is made first so that it is destroyed last: a Runtime must
  // outlive the threads that ran simulate() on it (its shutdown waits for them).
  dopt::RuntimeOptions ro;
  ro.threads = 2;  // dopt's share of the machine
  dopt::Runtime runtime(ro);
  EventLoop loop;
  ThreadPool pool(2);

  constexpr int kRanks = 4, kRounds = 20;
  int results = 0, ticks = 0;
  bool failed = false;

  pool.submit([&] {
    try {
      dopt::SimulateOptions so;
      so.runtime = &runtime;  // the program's runtime, not one of simulate's own
      dopt::simulate(kRanks, [&](dopt::RankContext& ctx) {
        for (int round = 0; round < kRounds; ++round) {
          Tensor t = Tensor::full({1}, ctx.rank() + round);
          // then() runs on a dopt thread when the all_reduce is done; it only
          // posts to the event loop, which does the program's work with the result.
          ctx.world().all_reduce_async(t).then([&loop, &results, t, rank = ctx.rank(), round](dopt::Future<void> f) {
            f.get();
            const double sum = t.item();
            loop.post([&results, rank, round, sum] {
              ++results;
              if (rank == 0 && round % 5 == 0) std::printf("event loop: round %d, all_reduce = %.0f\n", round, sum);
            });
          }).wait();  // the rank's own thread may wait; the event loop never does
          std::this_thread::sleep_for(std::chrono::milliseconds(2));  // stands for this rank's compute
        }
      }, so);
    } catch (const dopt::Error& e) {
      loop.post([&failed, msg = std::string(e.what())] {
        std::fprintf(stderr, "error: %s\n", msg.c_str());
        failed = true;
      });
    }
    loop.post([&loop] { loop.stop(); });
  });

  loop.run(std::chrono::milliseconds(1), [&] { ++ticks; });  // the program's own events
  const bool ok = !failed && results == kRanks * kRounds;
  std::printf("event loop handled %d results from %d ranks (expected %d) and %d timer ticks of its own; "
              "dopt ran on %d runtime threads\n",
              results, kRanks, kRanks * kRounds, ticks, runtime.threads());
  return ok ? 0 : 1;
}
