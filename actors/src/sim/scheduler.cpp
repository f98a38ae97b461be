#include "sim/scheduler.hpp"
#include "sim/stacks.hpp"
#include "sim/sync.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include <cxxabi.h>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/read_faults.hpp"
#include "sim/task_locals.hpp"

namespace dopt::detail::sim {

namespace {

std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ULL;
  }
  return h;
}

std::uint64_t mix_str(std::uint64_t h, const char* s) {
  for (; *s; ++s) {
    h ^= static_cast<unsigned char>(*s);
    h *= 1099511628211ULL;
  }
  return h;
}

std::uint64_t next_serial() {
  static std::atomic<std::uint64_t> n{0};
  return ++n;
}

const std::function<bool()>& never() {
  static const std::function<bool()> f = [] { return false; };
  return f;
}

std::string task_str(const Task& t) {
  return "rank " + std::to_string(t.rank) + " " + t.name + " #" + std::to_string(t.id);
}

/// The C++ runtime's per-thread exception state (the Itanium ABI's
/// __cxa_eh_globals, as libstdc++ and libc++abi lay it out): the exceptions
/// being handled and the count of those thrown and not yet caught. Every
/// task keeps its own: a task that switches inside a catch handler would
/// otherwise end another task's exception with its own.
struct EhGlobals {
  void* caught;
  unsigned int uncaught;
};

EhGlobals* eh_globals() { return reinterpret_cast<EhGlobals*>(abi::__cxa_get_globals()); }

/// Where the coroutines of abandoned tasks go: never resumed, never freed
/// (destroying one would unwind its stack, running its destructors).
void abandon(boost::context::fiber&& f) {
  static std::mutex m;
  static auto* graveyard = new std::vector<boost::context::fiber>();
  std::lock_guard<std::mutex> lock(m);
  graveyard->push_back(std::move(f));
}

/// The parked helper tasks (Scheduler::finish) by the id of their handle,
/// with their scheduler (kept alive until they are joined).
std::mutex& parked_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::thread::id, std::shared_ptr<Scheduler>>& parked() {
  static auto* p = new std::map<std::thread::id, std::shared_ptr<Scheduler>>();
  return *p;
}

std::shared_ptr<Scheduler> parked_scheduler(std::thread::id id) {
  std::lock_guard<std::mutex> lock(parked_mutex());
  auto it = parked().find(id);
  return it == parked().end() ? nullptr : it->second;
}

/// The checkpoint-read hook of the runtime: the fault plan of the calling task's simulation.
int read_fault(const std::string& path) {
  if (!active()) return 0;
  return tl_task->sched->on_read(path);
}

}  // namespace

Scheduler::Scheduler(std::uint64_t seed, const FaultPlan& plan, int world_size, std::shared_ptr<PeerTable> peers,
                     bool keep_trace)
    : seed_(seed),
      serial_(next_serial()),
      rng_(seed),
      fault_rng_(seed ^ 0x5eed5eed5eed5eedULL),
      plan_(plan),
      crash_at_(static_cast<std::size_t>(world_size), 0),
      stop_at_(static_cast<std::size_t>(world_size), 0),
      drop_at_(static_cast<std::size_t>(world_size), 0),
      read_fault_used_(plan.faults.size(), false),
      world_size_(world_size),
      peers_(std::move(peers)),
      keep_trace_(keep_trace),
      epoch_(Clock::now()) {
  const int limit = std::max(1, plan_.random_call_limit);
  const auto bad = [](const std::string& why) { return ValueError("simulate", "fault plan: " + why); };
  for (const auto& f : plan_.faults) {
    if (f.kind == FaultPlan::Kind::delay) {
      if (f.rank < -1 || f.rank >= world_size)
        throw bad("delay names rank " + std::to_string(f.rank) + " of a world of " + std::to_string(world_size));
      if (!(f.probability >= 0 && f.probability <= 1))
        throw bad("delay's probability must be within 0 and 1, got " + std::to_string(f.probability));
      if (f.delay.count() < 0) throw bad("delay's most must be >= 0 ms, got " + std::to_string(f.delay.count()));
    }
    if (f.kind != FaultPlan::Kind::crash && f.kind != FaultPlan::Kind::stop && f.kind != FaultPlan::Kind::drop)
      continue;
    const char* kind = f.kind == FaultPlan::Kind::crash ? "crash" : f.kind == FaultPlan::Kind::stop ? "stop" : "drop";
    if (f.rank < 0 || f.rank >= world_size)
      throw ValueError("simulate", "fault plan names rank " + std::to_string(f.rank) + " of a world of " +
                                       std::to_string(world_size));
    if (f.at < 0) throw bad(std::string(kind) + " of rank " + std::to_string(f.rank) + " at number " +
                            std::to_string(f.at) + " (1 and up; 0: drawn by the seed)");
    auto& v = f.kind == FaultPlan::Kind::crash ? crash_at_ : f.kind == FaultPlan::Kind::stop ? stop_at_ : drop_at_;
    if (v[static_cast<std::size_t>(f.rank)] != 0)
      throw bad("two " + std::string(kind) + " faults for rank " + std::to_string(f.rank) +
                " (one of each kind per rank; dopt-swarm's --faults and DOPT_SIM_FAULTS add to the program's own)");
    const int at = f.at > 0 ? f.at : 1 + static_cast<int>(splitmix(fault_rng_) % static_cast<std::uint64_t>(limit));
    v[static_cast<std::size_t>(f.rank)] = at;
  }
  for (const auto& f : plan_.faults) {
    if (f.kind != FaultPlan::Kind::partition) continue;
    has_partitions_ = true;
    for (int x : f.side)
      if (x < 0 || x >= world_size)
        throw ValueError("simulate", "fault plan's partition names rank " + std::to_string(x) + " of a world of " +
                                         std::to_string(world_size));
    std::vector<bool> in(static_cast<std::size_t>(world_size), false);
    for (int x : f.side) in[static_cast<std::size_t>(x)] = true;
    const auto inside = std::count(in.begin(), in.end(), true);  // distinct ranks on the named side
    if (inside == 0 || inside == world_size)
      throw bad("a partition must leave ranks on both sides, got " + std::to_string(f.side.size()) +
                " rank(s) of a world of " + std::to_string(world_size) + " on one side");
    if (f.from.count() < 0) throw bad("a partition's start must be >= 0 ms, got " + std::to_string(f.from.count()));
  }
  for (const auto& f : plan_.faults)
    if (f.kind == FaultPlan::Kind::fail_read || f.kind == FaultPlan::Kind::corrupt_read)
      g_read_fault_hook.store(&read_fault, std::memory_order_release);  // stays: it asks active() first
  calls_.assign(static_cast<std::size_t>(world_size), 0);
  messages_.assign(static_cast<std::size_t>(world_size), 0);
}

Scheduler::~Scheduler() {
  if (started_ && !over()) let_go("");
  if (started_ && !finished_) g_running.fetch_sub(1, std::memory_order_relaxed);
  for (auto& t : tasks_)
    if (t->ctx) abandon(std::move(t->ctx));
}

std::uint64_t Scheduler::next_random() { return splitmix(rng_); }

Task* Scheduler::add(int rank, bool is_rank, const char* name, std::function<void()> fn) {
  auto t = std::make_unique<Task>();
  t->sched = this;
  t->id = static_cast<int>(tasks_.size());
  t->rank = rank;
  t->is_rank = is_rank;
  t->name = name;
  t->fn = std::move(fn);
  Task* raw = t.get();
  raw->ctx = boost::context::fiber(std::allocator_arg, PooledStack(kStackBytes),
                                   [this, raw](boost::context::fiber&& driver) { return body(raw, std::move(driver)); });
  tasks_.push_back(std::move(t));
  live_.push_back(raw);
  return raw;
}

boost::context::fiber Scheduler::body(Task* t, boost::context::fiber&& driver) {
  driver_ = std::move(driver);
  try {
    const auto fn = std::move(t->fn);
    fn();
  } catch (const RankCrashed&) {
    // A helper task the fault plan crashed (rank bodies catch their own).
  } catch (const RankStopped&) {
  }
  t->state = Task::done;
  if (!over()) next_ = choose("exit");
  return std::move(driver_);
}

void Scheduler::run() {
  started_ = true;
  g_running.fetch_add(1, std::memory_order_relaxed);
  next_ = choose("start");
  while (Task* t = std::exchange(next_, nullptr)) resume(t);
}

void Scheduler::resume(Task* t) {
  Task* const outer = std::exchange(tl_task, t);
  EhGlobals* eh = eh_globals();
  const EhGlobals mine = std::exchange(*eh, EhGlobals{t->caught_exceptions, t->uncaught_exceptions});
  const char* label = exchange_call_label(t->call_label);
  const bool agent = rpc::detail::exchange_in_sim_agent(t->in_agent);
  t->ctx = std::move(t->ctx).resume();
  t->call_label = exchange_call_label(label);
  t->in_agent = rpc::detail::exchange_in_sim_agent(agent);
  const EhGlobals theirs = std::exchange(*eh, mine);
  t->caught_exceptions = theirs.caught;
  t->uncaught_exceptions = theirs.uncaught;
  tl_task = outer;
}

void Scheduler::suspend(Task*) { driver_ = std::move(driver_).resume(); }

int Scheduler::finish() {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (Task* t = choose_free(give_up)) {
    if (t->state == Task::blocked) t->state = Task::runnable;
    resume(t);
  }
  int left = 0;
  for (auto& t : tasks_)
    if (t->state != Task::done) ++left;
  park();
  finished_ = true;
  g_running.fetch_sub(1, std::memory_order_relaxed);
  return left;
}

void Scheduler::park() {
  std::lock_guard<std::mutex> lock(parked_mutex());
  for (auto& t : tasks_) {
    const auto it = parked().find(t->tid);
    const bool registered = it != parked().end() && it->second.get() == this;
    if (t->tid == std::thread::id() || (t->state == Task::done) == !registered) continue;
    if (t->state == Task::done) {
      parked().erase(t->tid);
      g_parked.fetch_sub(1, std::memory_order_release);
    } else {
      parked()[t->tid] = shared_from_this();
      g_parked.fetch_add(1, std::memory_order_release);
    }
  }
}

void Scheduler::finish_parked(std::thread::id id) {
  const auto keep = shared_from_this();  // park() may drop the registry's references
  {
    std::lock_guard<std::mutex> lock(driving_);  // one driver at a time
    Task* target = find(id);
    g_running.fetch_add(1, std::memory_order_relaxed);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (target && target->state != Task::done) {
      Task* t = choose_free(give_up);
      if (!t) break;
      if (t->state == Task::blocked) t->state = Task::runnable;
      resume(t);
    }
    g_running.fetch_sub(1, std::memory_order_relaxed);
    park();
  }
  std::lock_guard<std::mutex> lock(parked_mutex());
  if (auto it = parked().find(id); it != parked().end() && it->second == keep) {  // never to end: abandoned
    parked().erase(it);
    g_parked.fetch_sub(1, std::memory_order_release);
  }
}

Task* Scheduler::choose_free(std::chrono::steady_clock::time_point give_up) {
  const bool deadlocked = !deadlock_.empty();
  const auto n = tasks_.size();
  const auto can_run = [&](Task* t) {
    if (t->state == Task::done || (deadlocked && t->is_rank)) return false;
    if (t->ready) return (*t->ready)();
    return t->state == Task::runnable || t->state == Task::frozen;
  };
  const auto first_ready = [&]() -> Task* {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = (free_from_ + k) % n;
      Task* t = tasks_[i].get();
      if (can_run(t)) {
        free_from_ = i + 1;
        t->timed_out = false;
        return t;
      }
    }
    return nullptr;
  };
  for (;;) {
    if (Task* t = first_ready()) return t;
    // Nothing can run: the earliest deadline, once real time reached it (the
    // clock is real again); a wait on something outside (an actor) meanwhile.
    Task* best = nullptr;
    for (auto& up : tasks_) {
      Task* t = up.get();
      if (t->state != Task::done && !(deadlocked && t->is_rank) && t->ready && t->deadline &&
          (!best || *t->deadline < *best->deadline))
        best = t;
    }
    const auto real = std::chrono::steady_clock::now();
    if (best && epoch_ + std::chrono::nanoseconds(*best->deadline) <= real) {
      best->timed_out = true;
      return best;
    }
    if (real >= give_up) return nullptr;
    if (!best && real + std::chrono::milliseconds(2) < give_up)
      give_up = real + std::chrono::milliseconds(2);  // nothing to wait for but the outside: a short look
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Scheduler::record(Task* t, const char* what) {
  ++decisions_;
  hash_ = mix(mix(mix_str(hash_, what), static_cast<std::uint64_t>(t->id)), static_cast<std::uint64_t>(now_));
  if (keep_trace_ && events_.size() < (4u << 20)) events_.push_back(Event{t->id, what, now_});
}

Task* Scheduler::pick_ready() {
  // A partial Fisher-Yates shuffle of the live tasks, in place, until the
  // first that can run: uniform among those that can (as the first of them in
  // a uniformly random order), and the readiness of the others goes unasked
  // (at 1,024 ranks asking every blocked task made each decision O(ranks)).
  std::size_t i = 0;
  while (i < live_.size()) {
    const std::size_t left = live_.size() - i;
    if (left > 1) std::swap(live_[i], live_[i + static_cast<std::size_t>(next_random() % left)]);
    Task* t = live_[i];
    if (t->state == Task::done || t->state == Task::frozen) {  // never runs again before finish()
      live_[i] = live_.back();
      live_.pop_back();
      continue;
    }
    if (t->state == Task::runnable || (t->state == Task::blocked && (*t->ready)())) return t;
    ++i;
  }
  return nullptr;
}

Task* Scheduler::choose(const char* why) {
  if (Task* t = pick_ready()) {
    t->state = Task::runnable;
    t->timed_out = false;
    record(t, why);
    return t;
  }
  // Nobody can run: time moves on to the earliest deadline.
  Task* best = nullptr;
  for (Task* t : live_)
    if (t->state == Task::blocked && t->deadline &&
        (!best || *t->deadline < *best->deadline || (*t->deadline == *best->deadline && t->id < best->id)))
      best = t;
  if (best) {
    now_ = std::max(now_, *best->deadline);
    best->state = Task::runnable;
    best->timed_out = true;
    record(best, "timeout");
    return best;
  }
  bool ranks_left = false;
  for (Task* t : live_)
    if (t->is_rank && t->state != Task::done && t->state != Task::frozen) ranks_left = true;
  if (!ranks_left) {
    let_go("");
    return nullptr;
  }
  // A wait on something outside the simulation (e.g. a future an actor
  // fills): give it a moment of real time before calling it a deadlock.
  for (int i = 0; i < 2000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (Task* t : live_) {
      if (t->state == Task::blocked && (*t->ready)()) {
        t->state = Task::runnable;
        record(t, "external");
        return t;
      }
    }
  }
  std::string msg = "deadlock at virtual time " + std::to_string(now_ / 1000000) + " ms: nothing can progress;";
  for (auto& up : tasks_)
    if (up->state == Task::blocked) msg += " " + task_str(*up) + " waits on " + up->waits_on + ";";
  msg.pop_back();
  let_go(msg);
  return nullptr;
}

void Scheduler::pass(Task* me, const char* why) {
  Task* next = choose(why);
  if (next == me) return;
  next_ = next;  // null: the scheduler let go
  suspend(me);
}

void Scheduler::let_go(const std::string& deadlock) {
  {
    std::lock_guard<std::mutex> lock(over_m_);
    if (over_.load(std::memory_order_relaxed)) return;
    deadlock_ = deadlock;
    over_.store(true, std::memory_order_release);
  }
  // The tasks still alive run on in finish(); after a deadlock the ranks'
  // tasks are abandoned (what they wait on will never come).
}

std::string Scheduler::deadlock() const {
  std::lock_guard<std::mutex> lock(over_m_);
  return deadlock_;
}

bool Scheduler::block(Task* me, const std::function<bool()>& ready, std::optional<Clock::time_point> deadline,
                      const char* what) {
  me->ready = &ready;
  me->deadline.reset();
  if (deadline) me->deadline = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - epoch_).count();
  me->waits_on = what;
  me->state = Task::blocked;
  if (over())
    suspend(me);  // finish() resumes it once ready() holds, or at the deadline
  else
    pass(me, what);
  me->ready = nullptr;
  me->deadline.reset();
  if (me->state == Task::blocked) me->state = Task::runnable;
  return true;
}

void Scheduler::yield(Task* me, const char* what) {
  if (over()) return;
  me->state = Task::runnable;
  pass(me, what);
}

void Scheduler::sleep(Task* me, std::int64_t ns, const char* what) {
  block(me, never(), epoch_ + std::chrono::nanoseconds(now_ + ns), what);
}

Clock::time_point Scheduler::now() const {
  if (over()) return Clock::now();
  return epoch_ + std::chrono::nanoseconds(now_);
}

void Scheduler::fault(std::string what) {
  hash_ = mix_str(hash_, what.c_str());
  faults_.push_back(std::move(what));
}

void Scheduler::freeze_rank(int rank) {
  for (auto& up : tasks_)
    if (up->rank == rank && up->state != Task::done && up.get() != tl_task) up->state = Task::frozen;
}

void Scheduler::on_call(Task* me, const char* what) {
  if (over()) return;
  const auto r = static_cast<std::size_t>(me->rank);
  const int k = ++calls_[r];
  const bool crash_due = crash_at_[r] > 0 && k >= crash_at_[r];
  // Crashes and stops happen on the rank's own thread: at its k-th call, or
  // at the first one after it when the k-th came from a helper thread;
  // with an on_crash hook (rpc::simulate) a crash also happens on a helper.
  if (!me->is_rank && !(crash_due && on_crash_)) {
    yield(me, what);
    return;
  }
  if (crash_due) {
    crash_at_[r] = 0;
    const std::string why = "rank " + std::to_string(me->rank) + " crashed at its call " + std::to_string(k) + " (" +
                            what + "): injected by the fault plan";
    fault(why);
    ++counts_.crashes;
    freeze_rank(me->rank);
    any_frozen_ = true;
    if (peers_) peers_->mark(me->rank, PeerTable::lost, why);
    if (on_crash_) on_crash_(me->rank);
    if (!me->is_rank) {
      // A helper thread: it never runs again in this simulation (let go at its end, it throws).
      me->state = Task::frozen;
      pass(me, "crash");
    }
    me->crashed = true;
    throw RankCrashed{me->rank, why};
  }
  if (stop_at_[r] > 0 && k >= stop_at_[r]) {
    stop_at_[r] = 0;
    ++counts_.stops;
    any_frozen_ = true;
    fault("rank " + std::to_string(me->rank) + " stopped at its call " + std::to_string(k) + " (" + what +
          "): injected by the fault plan");
    freeze_rank(me->rank);
    me->state = Task::frozen;
    pass(me, "stop");
    throw RankStopped{me->rank};
  }
  yield(me, what);
}

std::chrono::nanoseconds Scheduler::draw_delay(int rank) {
  for (const auto& f : plan_.faults) {
    if (f.kind != FaultPlan::Kind::delay || (f.rank >= 0 && f.rank != rank) || f.delay.count() <= 0) continue;
    const double u = static_cast<double>(splitmix(fault_rng_) >> 11) * 0x1.0p-53;
    if (u >= f.probability) continue;
    const auto max_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(f.delay).count());
    return std::chrono::nanoseconds(static_cast<std::int64_t>(1 + splitmix(fault_rng_) % max_ns));
  }
  return std::chrono::nanoseconds(0);
}

std::chrono::nanoseconds Scheduler::message_fault(Task* me, const char* what, Channel channel) {
  if (over()) return std::chrono::nanoseconds(0);
  const auto r = static_cast<std::size_t>(me->rank);
  const int k = ++messages_[r];
  const bool coll = channel == Channel::collective;
  if (drop_at_[r] == k) {
    ++(coll ? counts_.collective_drops : counts_.rpc_drops);
    fault("message " + std::to_string(k) + " of rank " + std::to_string(me->rank) + " (" + what +
          ") dropped by the fault plan");
    return std::chrono::nanoseconds(-1);
  }
  const auto d = draw_delay(me->rank);
  if (d.count() > 0) ++(coll ? counts_.collective_delays : counts_.rpc_delays);
  return d;
}

bool Scheduler::cut(int src, int dst, const std::string& why) {
  std::lock_guard<std::mutex> lock(links_m_);
  return cut_.emplace(std::make_pair(src, dst), why).second;
}

std::string Scheduler::partition_between(int a, int b) const {
  for (const auto& f : plan_.faults) {
    if (f.kind != FaultPlan::Kind::partition || now_ < std::chrono::nanoseconds(f.from).count()) continue;
    const auto in = [&](int x) { return std::find(f.side.begin(), f.side.end(), x) != f.side.end(); };
    if (in(a) == in(b)) continue;
    std::string side;
    for (int x : f.side) side += (side.empty() ? "" : ", ") + std::to_string(x);
    return "the link from rank " + std::to_string(a) + " to rank " + std::to_string(b) +
           " is cut by a partition of ranks [" + side + "] from the rest (fault plan, from " +
           std::to_string(f.from.count()) + " ms)";
  }
  return "";
}

void Scheduler::lost_to_partition(int src, int dst, const std::string& what, const std::string& why) {
  if (over()) return;
  if (cut(src, dst, why)) fault(what + " lost: " + why);
  ++counts_.partitioned;
}

std::string Scheduler::link_lost(int src, int dst) const {
  std::lock_guard<std::mutex> lock(links_m_);
  auto it = cut_.find({src, dst});
  return it == cut_.end() ? std::string() : it->second;
}

Scheduler::SendFault Scheduler::send_fault(Task* me, int src, int dst, int tag) {
  SendFault out;
  if (over()) return out;
  const auto r = static_cast<std::size_t>(me->rank);
  const int k = ++messages_[r];
  const std::string msg = "send " + std::to_string(k) + " of rank " + std::to_string(src) + " (to rank " +
                          std::to_string(dst) + ", tag " + std::to_string(tag) + ")";
  if (std::string why = partition_between(src, dst); !why.empty()) {
    lost_to_partition(src, dst, msg, why);
    out.lost = true;
    out.why = std::move(why);
    return out;
  }
  if (drop_at_[r] == k) {
    const std::string why = "the link from rank " + std::to_string(src) + " to rank " + std::to_string(dst) +
                            " was lost: " + msg + " dropped by the fault plan";
    if (cut(src, dst, why)) fault(msg + " dropped by the fault plan: the link is lost");
  }
  if (std::string why = link_lost(src, dst); !why.empty()) {
    ++counts_.p2p_drops;
    out.lost = true;
    out.why = std::move(why);
    return out;
  }
  const auto d = draw_delay(me->rank);
  if (d.count() > 0) ++counts_.p2p_delays;
  // One (src, dst, tag) stays in order: never before its tag's earlier sends.
  auto& last = fifo_[{src, dst, tag}];
  last = std::max(last, now_ + d.count());
  out.hold = std::chrono::nanoseconds(last - now_);
  return out;
}

std::chrono::nanoseconds Scheduler::on_message(Task* me, const char* what) {
  const auto d = message_fault(me, what, Channel::collective);
  if (d.count() < 0) return d;
  if (d.count() > 0)
    sleep(me, d.count(), "delayed message");
  else
    yield(me, what);
  return std::chrono::nanoseconds(0);
}

int Scheduler::on_read(const std::string& path) {
  if (over()) return 0;
  for (std::size_t i = 0; i < plan_.faults.size(); ++i) {
    const auto& f = plan_.faults[i];
    if (f.kind != FaultPlan::Kind::fail_read && f.kind != FaultPlan::Kind::corrupt_read) continue;
    if (read_fault_used_[i] || path.find(f.path) == std::string::npos) continue;
    read_fault_used_[i] = true;
    const bool fail = f.kind == FaultPlan::Kind::fail_read;
    ++counts_.read_faults;
    fault(std::string("checkpoint read of ") + path + (fail ? " failed" : " corrupted") + " by the fault plan");
    return fail ? 1 : 2;
  }
  return 0;
}

void Scheduler::fill(SimReport& r) const {
  r.seed = seed_;
  r.trace_hash = r.decisions == 0 && r.trace_hash == 0 ? hash_ : mix(r.trace_hash, hash_);
  r.decisions += decisions_;
  r.virtual_time += std::chrono::nanoseconds(now_);
  r.faults.insert(r.faults.end(), faults_.begin(), faults_.end());
  auto& c = r.fired;
  c.collective_delays += counts_.collective_delays;
  c.p2p_delays += counts_.p2p_delays;
  c.rpc_delays += counts_.rpc_delays;
  c.collective_drops += counts_.collective_drops;
  c.p2p_drops += counts_.p2p_drops;
  c.rpc_drops += counts_.rpc_drops;
  c.partitioned += counts_.partitioned;
  c.crashes += counts_.crashes;
  c.stops += counts_.stops;
  c.read_faults += counts_.read_faults;
  fill_network(r);
  if (keep_trace_)
    for (const auto& e : events_)
      r.trace.push_back("t=" + std::to_string(e.vt) + " run " + task_str(*tasks_[static_cast<std::size_t>(e.task)]) +
                        " after " + e.what);
}

// --- the hooks -------------------------------------------------------------------

bool block(const std::function<bool()>& ready, std::optional<Clock::time_point> deadline, const char* what) {
  Task* me = tl_task;
  return me ? me->sched->block(me, ready, deadline, what) : false;
}

void yield(const char* what) {
  if (Task* me = tl_task) me->sched->yield(me, what);
}

Clock::time_point now() {
  Task* me = tl_task;
  return me ? me->sched->now() : Clock::now();
}

std::uint64_t run_id() {
  Task* me = tl_task;
  return me ? me->sched->serial() : 0;
}

std::thread spawn(std::function<void()> fn, const char* what) {
  Task* me = tl_task;
  if (!me || me->sched->over()) return std::thread(std::move(fn));
  Task* t = me->sched->add(me->rank, false, what, std::move(fn));
  // The caller owns a std::thread: a thread that ends at once, whose id
  // (unique until it is joined) names the task for join().
  std::thread handle([] {});
  t->tid = handle.get_id();
  return handle;
}

void join(std::thread& th) {
  Task* me = tl_task;
  if (!me) {
    // An ordinary thread (the owner, after the simulation): a parked task
    // runs to its end first, here.
    if (auto s = parked_scheduler(th.get_id())) s->finish_parked(th.get_id());
    return th.join();
  }
  Task* t = me->sched->find(th.get_id());
  if (!t) return th.join();
  t->tid = std::thread::id();
  // Itself (its owner destroyed from its own task), or a crashed rank's
  // task (never runs again here): let the handle go.
  if (t == me || t->state == Task::frozen) return th.detach();
  const std::function<bool()> done = [t] { return t->state == Task::done || t->state == Task::frozen; };
  me->sched->block(me, done, std::nullopt, "join");
  if (t->state == Task::frozen) return th.detach();
  th.join();
}

Task* Scheduler::find(std::thread::id id) {
  if (id == std::thread::id()) return nullptr;
  for (auto it = tasks_.rbegin(); it != tasks_.rend(); ++it)
    if ((*it)->tid == id) return it->get();
  return nullptr;
}

void on_call(const char* what) {
  if (Task* me = tl_task) me->sched->on_call(me, what);
}

std::chrono::nanoseconds on_message(const char* what) {
  Task* me = tl_task;
  return me ? me->sched->on_message(me, what) : std::chrono::nanoseconds(0);
}

std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

std::chrono::nanoseconds message_fault(const char* what) {
  Task* me = tl_task;
  return me ? me->sched->message_fault(me, what) : std::chrono::nanoseconds(0);
}

bool any_partition() {
  Task* me = tl_task;
  return me && !me->sched->over() && me->sched->has_partitions();
}

std::string partition_between(int a, int b) {
  Task* me = tl_task;
  return me && !me->sched->over() ? me->sched->partition_between(a, b) : std::string();
}

void lost_to_partition(int src, int dst, const std::string& what, const std::string& why) {
  if (Task* me = tl_task) me->sched->lost_to_partition(src, dst, what, why);
}

}  // namespace dopt::detail::sim
