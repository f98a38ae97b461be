#pragma once
// The deterministic scheduler behind simulate({.deterministic = true}).
//
// Every thread of a simulation is a Task backed by its own OS thread; one
// baton passes between them and only its holder runs. A task gives the
// baton up at the hooks of dopt/actors/internal/sim_hooks.hpp (block, yield, the end
// of its thread); the giving thread then picks the next holder itself (there
// is no scheduler thread): among the runnable tasks (yielded, new, or blocked
// with a ready() that now holds) one drawn by the seeded generator; when none
// is runnable, the blocked task with the earliest virtual deadline (the
// clock jumps to it); when none has a deadline and every rank's thread has
// ended, the simulation is over; otherwise it is a deadlock.
//
// Once over (or deadlocked) the scheduler lets go: every task that still
// waits for the baton returns from its hook with `false` and continues as an
// ordinary thread (the hooks' callers then wait as without simulation).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dopt/actors/sim.hpp"
#include "dopt/actors/internal/sim_hooks.hpp"
#include "plane/peer_table.hpp"

namespace dopt::detail::sim {

class Scheduler;

/// Thrown at the call where a fault plan crashes a rank (not a std::exception:
/// the rank's code is not meant to catch it).
struct RankCrashed {
  int rank;
  std::string why;
};
/// Thrown on a stopped rank's thread when the simulation ends.
struct RankStopped {
  int rank;
};

struct Task {
  enum State { runnable, blocked, done, frozen };
  Scheduler* sched = nullptr;
  int id = 0;
  int rank = 0;
  bool is_rank = false;  // the rank's own thread (runs fn)
  const char* name = "";
  State state = runnable;
  // While blocked (owned by the blocked thread's frame).
  const std::function<bool()>* ready = nullptr;
  std::optional<std::int64_t> deadline;  // virtual ns
  const char* waits_on = "";
  bool timed_out = false;
  // Hand-off of the baton.
  std::mutex m;
  std::condition_variable cv;
  std::atomic<bool> go{false};  // set under m (the sleeper's predicate), read without it while spinning
  bool released = false;  // the scheduler let go of this thread
  bool crashed = false;   // a fault plan crashed this rank thread
  std::thread::id tid;    // helper threads: their std::thread
};

struct Event {
  int task;
  const char* what;
  std::int64_t vt;
};

class Scheduler : public std::enable_shared_from_this<Scheduler> {
 public:
  /// peers (may be null): where a crashed rank is marked lost.
  Scheduler(std::uint64_t seed, const FaultPlan& plan, int world_size, std::shared_ptr<PeerTable> peers,
            bool keep_trace);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// A new task (before start(), or by the baton holder).
  Task* add(int rank, bool is_rank, const char* name);
  /// On the task's own thread, first: waits for the baton.
  void enter(Task* t);
  /// On the task's own thread, last: passes the baton on.
  void exit(Task* t);
  /// Main thread: hands the baton to the first task.
  void start();
  /// Main thread: waits until the scheduler let go (all ranks ended, or a deadlock).
  void wait_over();

  bool block(Task* me, const std::function<bool()>& ready, std::optional<Clock::time_point> deadline,
             const char* what);
  void yield(Task* me, const char* what);
  Clock::time_point now() const;
  std::int64_t vnow() const noexcept { return now_; }
  void sleep(Task* me, std::int64_t ns, const char* what);

  /// Where a message travels (what the report counts it as).
  enum class Channel { collective, rpc };
  /// Fault plans: a call / a protocol message of `me`'s rank.
  void on_call(Task* me, const char* what);
  std::chrono::nanoseconds on_message(Task* me, const char* what);
  /// on_message's decision without its scheduling point: the delay, or negative (dropped).
  std::chrono::nanoseconds message_fault(Task* me, const char* what, Channel channel = Channel::rpc);
  /// The fault plan's decision for a send of global rank src to dst (a
  /// message of `me`'s rank): how long to hold it back (its tag's earlier
  /// sends on the link are never overtaken), or lost (why: the cut link).
  struct SendFault {
    std::chrono::nanoseconds hold{0};
    bool lost = false;
    std::string why;
  };
  SendFault send_fault(Task* me, int src, int dst, int tag);
  /// Why the fault plan's partitions separate global ranks a and b at this
  /// virtual time ("" when they do not). Any task; not a scheduling point.
  std::string partition_between(int a, int b) const;
  /// A message from src to dst (`what`: its kind) lost to a partition (why):
  /// counted; the first loss on each link is recorded as a fault.
  void lost_to_partition(int src, int dst, const std::string& what, const std::string& why);
  /// Why the link from src to dst is lost ("" while it is not). Any thread.
  std::string link_lost(int src, int dst) const;
  /// Rank r crashed: its other tasks never run again.
  void freeze_rank(int rank);
  /// Fault plan of checkpoint reads: 0 ok, 1 fail, 2 corrupt.
  int on_read(const std::string& path);
  /// The helper task running on thread id (null: none).
  Task* find(std::thread::id id);

  bool over() const noexcept { return over_.load(std::memory_order_acquire); }
  /// A fault plan crashed or stopped a rank (its threads were frozen).
  bool any_frozen() const noexcept { return any_frozen_; }
  /// Called (on the crashing thread, holding the baton) when a fault plan
  /// crashes a rank; with it set, a crash may also happen on a helper
  /// thread's call (which then never runs again). Set before start().
  void set_on_crash(std::function<void(int rank)> f) { on_crash_ = std::move(f); }
  /// A deadlock the scheduler found ("" when none).
  std::string deadlock() const;
  /// The run's report (call after wait_over()).
  void fill(SimReport& r) const;
  std::uint64_t seed() const noexcept { return seed_; }
  /// Unique among the schedulers of this process.
  std::uint64_t serial() const noexcept { return serial_; }

 private:
  std::uint64_t next_random();
  Task* choose(const char* why);
  void pass(Task* me, const char* why);
  void hand(Task* t);
  bool wait_go(Task* t);
  void let_go(const std::string& deadlock);
  void record(Task* t, const char* what);
  void fault(std::string what);
  /// A delay drawn for a message of `rank` by the plan's delay faults (0: none).
  std::chrono::nanoseconds draw_delay(int rank);
  /// Cuts the link src -> dst (the first reason stays); true when it was up.
  bool cut(int src, int dst, const std::string& why);

  std::uint64_t seed_;
  std::uint64_t serial_;
  std::uint64_t rng_;
  std::uint64_t fault_rng_;
  FaultPlan plan_;
  std::vector<int> crash_at_, stop_at_, drop_at_;  // per rank; 0: none
  std::vector<bool> read_fault_used_;
  std::vector<int> calls_, messages_;  // per rank
  bool started_ = false;
  bool any_frozen_ = false;
  int world_size_;
  std::shared_ptr<PeerTable> peers_;
  bool keep_trace_;
  Clock::time_point epoch_;
  std::int64_t now_ = 0;
  std::deque<std::unique_ptr<Task>> tasks_;
  std::vector<Task*> scratch_;
  std::vector<Event> events_;
  std::uint64_t hash_ = 1469598103934665603ULL;
  std::uint64_t decisions_ = 0;
  std::vector<std::string> faults_;
  FaultCounts counts_;
  mutable std::mutex links_m_;                      // guards cut_ (read by continuations)
  std::map<std::pair<int, int>, std::string> cut_;  // (src, dst): why the link is lost
  std::map<std::tuple<int, int, int>, std::int64_t> fifo_;  // (src, dst, tag): last release (virtual ns)
  std::atomic<bool> over_{false};
  mutable std::mutex over_m_;
  std::condition_variable over_cv_;
  std::string deadlock_;
  std::function<void(int)> on_crash_;
};

/// What a simulation reports for a rank's exception: its what(), or
/// "unknown exception" when it is not a std::exception.
std::string describe(const std::exception_ptr& e);

/// Runs body(r) for ranks 0..world_size-1 as the rank tasks of one
/// deterministic scheduler (simulate.cpp; dopt::simulate and rpc::simulate):
/// returns when every rank's body ended, the threads joined. The plan is
/// `faults` plus DOPT_SIM_FAULTS. Fills `report` (when set), appends the
/// run's line to DOPT_SIM_TRACE_LOG and its trace to DOPT_SIM_TRACE_DUMP.
/// Throws StateError on a deadlock (the parked threads are abandoned).
/// body must catch what fn throws, RankCrashed and RankStopped included.
/// peers (may be null): marked lost for every rank when a rank was frozen.
/// on_crash: Scheduler::set_on_crash.
void run_ranks(int world_size, std::uint64_t seed, const FaultPlan& faults, bool keep_trace, SimReport* report,
               const std::shared_ptr<PeerTable>& peers, const std::function<void(int)>& body,
               std::function<void(int)> on_crash = {});

}  // namespace dopt::detail::sim
