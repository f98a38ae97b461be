#include "plane/executor.hpp"

#include "dopt/actors/internal/sim_hooks.hpp"

namespace dopt::detail {

SerialExecutor::SerialExecutor(Body body, int rank) : s_(std::make_shared<State>()) {
  s_->body = std::move(body);
  s_->rank = rank;
}

SerialExecutor::~SerialExecutor() {
  stop("the process group was destroyed before the operation ran");
  sim::release_thread(worker_);
}

std::optional<std::uint64_t> SerialExecutor::stop(const std::string& why) {
  std::map<std::uint64_t, OpPtr> failed;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(s_->mutex);
    if (!s_->stopping) {
      s_->stopping = true;
      s_->stop_why = why;
    }
    reason = s_->stop_why;
    failed.swap(s_->pending);
  }
  s_->cv.notify_all();
  for (auto& [seq, op] : failed)
    op->promise.set_exception(std::make_exception_ptr(StateError(coll_name(op->desc.kind), reason, s_->rank)));
  if (failed.empty()) return std::nullopt;
  return failed.begin()->first;
}

std::exception_ptr SerialExecutor::run_body(State& s, std::unique_lock<std::mutex>& lock, const Op& op) {
  s.busy = true;
  lock.unlock();
  std::exception_ptr error;
  try {
    s.body(op);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  s.busy = false;
  ++s.next;
  return error;
}

void SerialExecutor::run(const OpPtr& op) {
  State& s = *s_;
  std::unique_lock<std::mutex> lock(s.mutex);
  if (s.stopping) throw StateError(coll_name(op->desc.kind), s.stop_why, s.rank);
  if (!s.busy && s.pending.empty() && op->seq == s.next) {
    const std::exception_ptr error = run_body(s, lock, *op);
    const bool more = s.next_ready();
    lock.unlock();
    if (more) s.cv.notify_all();
    if (error) std::rethrow_exception(error);
    return;
  }
  auto fut = op->promise.get_future();
  lock.unlock();
  enqueue(op);
  fut.get();
}

Future<void> SerialExecutor::run_async(const OpPtr& op) {
  auto fut = op->promise.get_future();
  enqueue(op);
  return fut;
}

void SerialExecutor::enqueue(const OpPtr& op) {
  State& s = *s_;
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.stopping) {
      refused = s.stop_why;
    } else {
      s.pending.emplace(op->seq, op);
      if (!worker_.joinable()) worker_ = sim::make_thread([st = s_] { worker_loop(st); }, "executor");
    }
  }
  if (!refused.empty()) {
    op->promise.set_exception(std::make_exception_ptr(StateError(coll_name(op->desc.kind), refused, s.rank)));
    return;
  }
  s.cv.notify_all();
}

void SerialExecutor::worker_loop(const std::shared_ptr<State>& sp) {
  State& s = *sp;
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    sim::cv_wait(s.cv, lock, [&] { return s.stopping || s.next_ready(); }, "executor queue");
    if (!s.next_ready()) break;  // stopping, nothing runnable
    OpPtr op = s.pending.begin()->second;
    s.pending.erase(s.pending.begin());
    const std::exception_ptr error = run_body(s, lock, *op);
    lock.unlock();
    // Outside the lock: continuations may submit the next calls.
    if (error) op->promise.set_exception(error);
    else op->promise.set_value();
    op.reset();
    lock.lock();
  }
}

}  // namespace dopt::detail
