#pragma once
// Internal: the points where dopt's waits hand control to the deterministic
// scheduler of dopt::simulate({.deterministic = true}). Not part of the API.
//
// Outside deterministic mode every hook is one relaxed load of a global
// counter (no simulation anywhere in the process: 0) and does nothing else.
// Inside it, the caller is a task of the scheduler (a fiber on the thread
// of run_ranks): it must call the hooks without holding a mutex that another
// simulated task could need (they all run on that one thread).
#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>

namespace dopt::detail {
struct Op;
}

namespace dopt::detail::sim {

struct Task;

/// Number of deterministic simulations running in this process.
inline std::atomic<int> g_running{0};
/// Helper tasks whose simulation ended while they waited (parked): joining
/// one's handle from an ordinary thread runs it to its end first.
inline std::atomic<int> g_parked{0};
/// The simulated task running on this thread (null: an ordinary thread).
inline thread_local Task* tl_task = nullptr;

/// This thread runs under a deterministic scheduler.
inline bool active() noexcept {
  return g_running.load(std::memory_order_relaxed) != 0 && tl_task != nullptr;
}

using Clock = std::chrono::steady_clock;

// The out-of-line parts (actors/src/sim/scheduler.cpp); call only when active().

/// Gives up control until ready() holds or the (virtual) deadline passed.
/// ready() runs on whichever simulated task schedules next: it only reads.
/// Returns false when the caller is not a simulated task (it then waits as
/// it would without simulation); once the simulation ended, the wait goes on
/// in the driver's finish() (the deadline in real time).
bool block(const std::function<bool()>& ready, std::optional<Clock::time_point> deadline, const char* what);
/// A scheduling point: another runnable thread may run first.
void yield(const char* what);
/// Virtual time (real time once the scheduler let go).
Clock::time_point now();
/// A simulated task of the calling task's rank running fn; the std::thread
/// returned is its handle (join it with join_thread).
std::thread spawn(std::function<void()> fn, const char* what);
/// Joins t, letting the scheduler run t's task to its end first (also from
/// an ordinary thread, when t's task was parked).
void join(std::thread& t);
/// A collective, send or recv of the calling rank starts: fault plans may
/// crash or stop the rank here. `what` names the call.
void on_call(const char* what);
/// This rank publishes a protocol step: returns the virtual delay to apply
/// first (fault plans: delayed messages), or a negative value to drop it.
std::chrono::nanoseconds on_message(const char* what);
/// SimulateOptions::network: the calling task spends the call's modelled
/// time (actors/src/sim/network.cpp); nothing without a network model.
void model_call(const Op& op);

/// Why the fault plan's partitions separate global ranks a and b now ("" when
/// they do not). Not a scheduling point. Called by the shared-memory
/// collectives and the simulated RPC agents (transport/shm, rpc).
std::string partition_between(int a, int b);
/// The calling task's fault plan has partitions (false when not simulated):
/// without, partition_between is "" for every pair, and callers need not ask
/// (the shared-memory waits asked for every member at every wait).
bool any_partition();
/// A message from global rank src to dst lost to a partition (why, from
/// partition_between): counted in the run report, the first on each link
/// recorded as a fault. `what` names the message ("rpc request of rank 0").
void lost_to_partition(int src, int dst, const std::string& what, const std::string& why);

/// The time the plane's waits measure deadlines against.
inline Clock::time_point clock_now() { return active() ? now() : Clock::now(); }

/// std::thread(fn), or a simulated task when the caller is one.
template <class F>
std::thread make_thread(F&& fn, const char* what) {
  if (active()) [[unlikely]]
    return spawn(std::function<void()>(std::forward<F>(fn)), what);
  return std::thread(std::forward<F>(fn));
}

/// t.join(), cooperating with the scheduler when the caller is simulated or
/// t is a parked task's handle.
inline void join_thread(std::thread& t) {
  if (active() || g_parked.load(std::memory_order_acquire) != 0) [[unlikely]]
    return join(t);
  t.join();
}

/// For the owner of thread t when it ends: joins t (join_thread), or
/// detaches it when the caller is t itself (the owner destroyed from a
/// continuation on that thread); nothing when t is not joinable.
inline void release_thread(std::thread& t) {
  if (!t.joinable()) return;
  if (t.get_id() == std::this_thread::get_id()) t.detach();
  else join_thread(t);
}

/// cv.wait(lock, pred), yielding to the scheduler first when simulated.
template <class Lock, class Cv, class Pred>
void cv_wait(Cv& cv, Lock& lock, Pred pred, const char* what) {
  if (active() && !pred()) [[unlikely]] {
    auto* m = lock.mutex();
    lock.unlock();
    block([&] {
      std::lock_guard<std::remove_pointer_t<decltype(m)>> g(*m);
      return pred();
    }, std::nullopt, what);
    lock.lock();
  }
  cv.wait(lock, pred);
}

}  // namespace dopt::detail::sim
