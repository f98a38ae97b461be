#pragma once
// Runs one rank's calls of one group in their sequence order: a blocking
// call on its caller's thread when nothing is queued before it (no thread
// hand-off on the fast path), everything else on a worker thread that is
// started on first need. Errors: run() throws the call's error, run_async()
// carries it in the future.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dopt/actors/future.hpp"
#include "dopt/actors/internal/op.hpp"

namespace dopt::detail {

class SerialExecutor {
 public:
  using Body = std::function<void(const Op&)>;
  explicit SerialExecutor(Body body, int rank);
  /// stop(), then joins the worker (or detaches it when called on it).
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void run(const OpPtr& op);
  Future<void> run_async(const OpPtr& op);
  /// Fails every queued and later call with StateError(why); a call that is
  /// running finishes (its waits end on their own, e.g. at shutdown).
  /// Returns the lowest sequence number of the queued calls it failed
  /// (nullopt: none).
  std::optional<std::uint64_t> stop(const std::string& why);

 private:
  // The worker thread shares this state, so that it can outlive the
  // executor (destroyed from a continuation on that very thread).
  struct State {
    Body body;
    int rank = 0;
    std::mutex mutex;
    std::condition_variable cv;
    std::map<std::uint64_t, OpPtr> pending;  // by sequence number
    std::uint64_t next = 0;
    bool busy = false;
    bool stopping = false;
    std::string stop_why;
    bool next_ready() const { return !busy && !pending.empty() && pending.begin()->first == next; }
  };
  static void worker_loop(const std::shared_ptr<State>& s);
  /// Runs the body on op with s.mutex released (busy meanwhile); returns
  /// with `lock` held again and s.next advanced: what the body threw, if anything.
  static std::exception_ptr run_body(State& s, std::unique_lock<std::mutex>& lock, const Op& op);
  void enqueue(const OpPtr& op);

  std::shared_ptr<State> s_;
  std::thread worker_;
};

}  // namespace dopt::detail
