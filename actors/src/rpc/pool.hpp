#pragma once
// Internal to dopt_actors: the thread pool that runs RPC user functions.
// In deterministic simulation its threads are tasks of the scheduler
// (spawned by the agent's task, so of the worker's rank).
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dopt/actors/internal/sim_hooks.hpp"

namespace dopt::rpc::detail {

/// Grows on demand up to max_threads threads.
class Pool {
 public:
  explicit Pool(int max_threads) : s_(std::make_shared<S>()) { s_->max = std::max(1, max_threads); }
  ~Pool() { join(); }
  void post(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(s_->m);
    if (s_->stop) return;
    s_->q.push_back(std::move(f));
    if (static_cast<int>(s_->q.size()) > s_->idle && static_cast<int>(s_->threads.size()) < s_->max)
      s_->threads.push_back(::dopt::detail::sim::make_thread([s = s_] { loop(s); }, "rpc pool"));
    else
      s_->cv.notify_one();
  }
  /// Stops taking tasks; queued ones are dropped; running ones finish.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(s_->m);
      s_->stop = true;
      s_->q.clear();
    }
    s_->cv.notify_all();
  }
  void join() {
    stop();
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> lock(s_->m);
      ts.swap(s_->threads);
    }
    for (auto& t : ts) {
      if (t.get_id() == std::this_thread::get_id())
        t.detach();
      else if (t.joinable())
        ::dopt::detail::sim::join_thread(t);
    }
  }

 private:
  struct S {
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    std::vector<std::thread> threads;
    int idle = 0;
    int max = 1;
    bool stop = false;
  };
  static void loop(std::shared_ptr<S> s) {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(s->m);
        ++s->idle;
        ::dopt::detail::sim::cv_wait(s->cv, lock, [&] { return s->stop || !s->q.empty(); }, "rpc pool");
        --s->idle;
        if (s->stop) return;
        f = std::move(s->q.front());
        s->q.pop_front();
      }
      try {
        f();
      } catch (...) {
      }
    }
  }
  std::shared_ptr<S> s_;
};

}  // namespace dopt::rpc::detail
