#pragma once
// The deterministic scheduler behind simulate({.deterministic = true}).
//
// Every simulated thread is a Task: a stackful coroutine (a Boost.Context
// fiber with a guarded stack of kStackBytes) that the thread of run_ranks,
// the driver, resumes. Only one task runs at a time; a task gives control up
// at the hooks of dopt/actors/internal/sim_hooks.hpp (block, yield, the end of
// its function): it picks the next task itself and switches to the driver,
// which resumes that one. The pick: among the runnable tasks (yielded, new,
// or blocked with a ready() that now holds) one drawn by the seeded
// generator; when none is runnable, the blocked task with the earliest
// virtual deadline (the clock jumps to it); when none has a deadline and
// every rank's task has ended, the simulation is over; otherwise it is a
// deadlock.
//
// Once over (or deadlocked) the scheduler lets go: the driver then runs the
// tasks still alive (not those of the ranks after a deadlock) without
// recording, one whose wait holds at a time, deadlines in real time, until
// none can run. Helper tasks left then (a plane's engine that its owner stops
// after the simulation) are parked: joining one's handle runs it on to its
// end on the joining thread. Tasks never joined, and the ranks' after a
// deadlock, are abandoned (their stacks never resumed nor freed).
#include <atomic>
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

#include <boost/context/fiber.hpp>

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
/// Thrown on a stopped rank's task when the simulation ends.
struct RankStopped {
  int rank;
};

/// The stack of every task: its size bounds a rank's stack memory (only the
/// pages a task touched are resident); a guard page below it faults on
/// overflow (stacks.hpp: where the kernel's limit on mappings allows one).
inline constexpr std::size_t kStackBytes = 256u << 10;

struct Task {
  enum State { runnable, blocked, done, frozen };
  Scheduler* sched = nullptr;
  int id = 0;
  int rank = 0;
  bool is_rank = false;  // the rank's own task (runs the rank's body)
  const char* name = "";
  State state = runnable;
  // While blocked (owned by the blocked task's frame).
  const std::function<bool()>* ready = nullptr;
  std::optional<std::int64_t> deadline;  // virtual ns
  const char* waits_on = "";
  bool timed_out = false;
  bool crashed = false;   // a fault plan crashed this rank's task
  std::thread::id tid;    // helper tasks: the id of the handle spawn() returned
  // The coroutine: what it runs (until it starts), and where it stopped.
  std::function<void()> fn;
  boost::context::fiber ctx;
  // What belongs to a task on its thread, while it is suspended: the C++
  // runtime's exceptions in flight (a task may switch inside a catch
  // handler), and dopt's thread-locals.
  void* caught_exceptions = nullptr;
  unsigned int uncaught_exceptions = 0;
  const char* call_label = nullptr;
  bool in_agent = false;
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

  /// A new task running fn (before run(), or by the running task).
  Task* add(int rank, bool is_rank, const char* name, std::function<void()> fn);
  /// The driver (the thread of run_ranks): runs the tasks until the
  /// scheduler let go (all ranks ended, or a deadlock).
  void run();
  /// The driver, after run() (and after marking what a frozen rank left
  /// lost): runs the tasks still alive to their end, or until none can run.
  /// The helper tasks left are parked: join() of their handle from an
  /// ordinary thread (their owner's, typically simulate()'s after the run)
  /// runs them on there (finish_parked); the ranks' tasks left are abandoned.
  /// Returns the number of tasks left.
  int finish();
  /// join() of the parked task whose handle has id, on an ordinary thread:
  /// runs the parked tasks that can run until that one ended (or none can
  /// run: it is abandoned).
  void finish_parked(std::thread::id id);

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
  bool has_partitions() const noexcept { return has_partitions_; }
  /// A message from src to dst (`what`: its kind) lost to a partition (why):
  /// counted; the first loss on each link is recorded as a fault.
  void lost_to_partition(int src, int dst, const std::string& what, const std::string& why);
  /// Why the link from src to dst is lost ("" while it is not). Any thread.
  std::string link_lost(int src, int dst) const;
  /// Rank r crashed: its other tasks never run again.
  void freeze_rank(int rank);
  /// Fault plan of checkpoint reads: 0 ok, 1 fail, 2 corrupt.
  int on_read(const std::string& path);
  /// The helper task whose handle (spawn) has id (null: none).
  Task* find(std::thread::id id);

  bool over() const noexcept { return over_.load(std::memory_order_acquire); }
  /// A fault plan crashed or stopped a rank (its tasks were frozen).
  bool any_frozen() const noexcept { return any_frozen_; }
  /// Called (on the crashing task) when a fault plan crashes a rank; with it
  /// set, a crash may also happen on a helper task's call (which then never
  /// runs again). Set before run().
  void set_on_crash(std::function<void(int rank)> f) { on_crash_ = std::move(f); }
  /// The network model whose costs the calls take (network.cpp); set before run().
  void set_network(const dopt::sim::NetworkModel& m);
  const dopt::sim::NetworkModel* network() const noexcept { return network_ ? &*network_ : nullptr; }
  int world_size() const noexcept { return world_size_; }
  /// The running task `me` spends ns of virtual time on a modelled call;
  /// `count`: the call's bytes and time go into the report (once per call).
  void charge(Task* me, std::int64_t ns, const std::vector<std::uint64_t>& link_bytes, bool count);
  /// fill()'s part for the network model (network.cpp).
  void fill_network(SimReport& r) const;
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
  /// A task that can run, drawn uniformly among them (null: none).
  Task* pick_ready();
  /// After let_go (finish): the next task to run on, in turn (null: none
  /// can run, or real time reached give_up).
  Task* choose_free(std::chrono::steady_clock::time_point give_up);
  void pass(Task* me, const char* why);
  /// The running task: back to the driver (returns when resumed).
  void suspend(Task* me);
  /// The driver: runs t until it suspends or ends.
  void resume(Task* t);
  /// Registers the helper tasks left alive as parked, unregisters the ended.
  void park();
  /// The body of t's coroutine.
  boost::context::fiber body(Task* t, boost::context::fiber&& driver);
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
  bool finished_ = false;
  bool has_partitions_ = false;
  bool any_frozen_ = false;
  int world_size_;
  std::shared_ptr<PeerTable> peers_;
  bool keep_trace_;
  Clock::time_point epoch_;
  std::int64_t now_ = 0;
  std::deque<std::unique_ptr<Task>> tasks_;
  std::vector<Task*> live_;  // the tasks not yet ended or frozen (in the order the draws leave them)
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
  std::string deadlock_;
  boost::context::fiber driver_;  // while a task runs: the driver, where it suspends to
  Task* next_ = nullptr;          // the task the driver resumes next
  std::size_t free_from_ = 0;     // after let_go: where choose_free looks first
  std::mutex driving_;            // finish_parked: one thread drives at a time
  std::function<void(int)> on_crash_;
  std::optional<dopt::sim::NetworkModel> network_;
  std::vector<std::uint64_t> link_bytes_;  // per host
  std::int64_t modelled_ns_ = 0;
};

/// What a simulation reports for a rank's exception: its what(), or
/// "unknown exception" when it is not a std::exception.
std::string describe(const std::exception_ptr& e);

/// Runs body(r) for ranks 0..world_size-1 as the rank tasks of one
/// deterministic scheduler on the calling thread (run_ranks.cpp; called by
/// dopt::simulate and rpc::simulate): returns when every rank's body ended. The plan is
/// `faults` plus DOPT_SIM_FAULTS. Fills `report` (when set), appends the
/// run's line to DOPT_SIM_TRACE_LOG and its trace to DOPT_SIM_TRACE_DUMP.
/// Throws StateError on a deadlock (the ranks' tasks are abandoned).
/// body must catch what fn throws, RankCrashed and RankStopped included.
/// peers (may be null): marked lost for every rank when a rank was frozen.
/// on_crash: Scheduler::set_on_crash. network: Scheduler::set_network.
void run_ranks(int world_size, std::uint64_t seed, const FaultPlan& faults, bool keep_trace, SimReport* report,
               const std::shared_ptr<PeerTable>& peers, const std::function<void(int)>& body,
               std::function<void(int)> on_crash = {},
               const std::optional<dopt::sim::NetworkModel>& network = std::nullopt);

}  // namespace dopt::detail::sim
