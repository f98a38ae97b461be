// The agent's link in deterministic simulation (rpc::simulate with
// deterministic = true): instead of a CAF actor, every agent has a mailbox
// that a task of the seeded scheduler drains, one message per scheduling
// point. Sends between agents go straight into the peer's mailbox (the fault
// plan may drop or delay them: a delayed message waits in the mailbox until
// its virtual time); deadlines are timers in virtual time. The handlers are
// the same as the CAF actor's (handlers.cpp).
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "rpc/handlers.hpp"
#include "sim/task_locals.hpp"

namespace dopt::rpc::detail {

namespace sim = ::dopt::detail::sim;

namespace {
thread_local bool tl_in_agent = false;
}  // namespace

bool in_sim_agent() noexcept { return tl_in_agent; }
bool exchange_in_sim_agent(bool v) noexcept { return std::exchange(tl_in_agent, v); }

class SimAgent final : public AgentLink, public std::enable_shared_from_this<SimAgent> {
 public:
  using Job = std::function<void()>;

  explicit SimAgent(const std::shared_ptr<AgentCore>& core) { st_.core = core; }

  void set_peers(std::vector<std::weak_ptr<SimAgent>> peers) {
    peers_ = std::move(peers);
    st_.started = true;
  }

  /// Queues job, at once or at virtual time `at` (timers and delayed messages).
  void post(Job job, std::optional<sim::Clock::time_point> at = std::nullopt) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (stopped_) return;
      if (at) {
        // An earlier deadline than the one the agent's task waits with
        // (a late message from a peer): wake it to wait again with this one.
        if (!deadline_ || *at < *deadline_) rearm_ = true;
        timers_.emplace(*at, std::move(job));  // equal times: in the order armed
      } else
        q_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  /// On the worker's rank task.
  void start() {
    auto self = shared_from_this();
    thread_ = sim::make_thread([self] { self->loop(); }, "rpc agent");
  }

  /// kill: as if the worker's process died; else a graceful stop. Either
  /// way its peers see it gone (as CAF's monitors see an actor exit).
  void stop(bool kill) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_all();
    const int me = st_.core->rank;
    const std::string why = kill ? "its agent exited: killed (as if its process died)"
                                 : "its agent exited: it shut down";
    for (auto& w : peers_)
      if (auto p = w.lock(); p && p.get() != this) {
        SimAgent* raw = p.get();  // runs on p's own task
        p->post([raw, me, why] { handle_lost(raw->st_, *raw, me, why); });
      }
    if (thread_.joinable()) {
      if (thread_.get_id() == std::this_thread::get_id())
        thread_.detach();
      else
        sim::join_thread(thread_);  // a frozen agent (its worker crashed): detached, it never runs again
    }
    // The agent's task runs no handler any more: its calls in flight fail (~OutCall).
    std::map<std::uint64_t, OutCallPtr> pending;
    std::deque<Job> q;
    std::multimap<sim::Clock::time_point, Job> timers;
    {
      std::lock_guard<std::mutex> lock(m_);
      q.swap(q_);
      timers.swap(timers_);
      pending.swap(st_.pending);
    }
  }

  // AgentLink (on the agent's task)
  void request(int dest, const Request& r) override {
    deliver(dest, "rpc request", [r = Request(r)](SimAgent& p) mutable { handle_request(p.st_, p, std::move(r)); });
  }
  void reply(int dest, std::uint64_t id, const ReplyPtr& r) override {
    deliver(dest, "rpc reply", [id, r](SimAgent& p) { handle_reply(p.st_, p, id, *r); });
  }
  void arm_timeout(std::chrono::milliseconds d, std::uint64_t id, int attempt) override {
    post([this, id, attempt] {
      // The last attempt's time is up while a partition cuts the callee off:
      // to this side it is lost (its calls fail as if it died).
      int dest = -1;
      const std::string why = partitioned_call(id, attempt, dest);
      if (why.empty()) return handle_timeout(st_, *this, id, attempt);
      handle_lost(st_, *this, dest, why);
    }, sim::clock_now() + std::chrono::duration_cast<sim::Clock::duration>(d));
  }

  AgentState& state() { return st_; }

 private:
  void deliver(int dest, const char* what, std::function<void(SimAgent&)> fn) {
    if (dest < 0 || dest >= static_cast<int>(peers_.size())) return;
    auto p = peers_[static_cast<std::size_t>(dest)].lock();
    if (!p) return;
    std::optional<sim::Clock::time_point> at;
    if (sim::active()) {
      const int me = st_.core->rank;
      if (const std::string why = sim::partition_between(me, dest); !why.empty())
        return sim::lost_to_partition(me, dest, std::string(what) + " of rank " + std::to_string(me), why);
      const auto d = sim::message_fault(what);
      if (d.count() < 0) return;  // dropped by the fault plan
      if (d.count() > 0) at = sim::clock_now() + std::chrono::duration_cast<sim::Clock::duration>(d);
    }
    SimAgent* raw = p.get();
    p->post([raw, fn = std::move(fn)] { fn(*raw); }, at);
  }

  /// Why call `id` failed for good at the timeout of its attempt `attempt`
  /// because a partition cuts its callee (dest) off ("" when it did not).
  std::string partitioned_call(std::uint64_t id, int attempt, int& dest) const {
    auto it = st_.pending.find(id);
    if (it == st_.pending.end() || it->second->attempts != attempt || attempt <= it->second->spec.retries) return "";
    dest = it->second->dest;
    const std::string why = sim::active() ? sim::partition_between(st_.core->rank, dest) : std::string();
    return why.empty() ? why : "cut off: " + why;
  }

  /// The next job: the first queued one, else a timer that is due.
  bool take(Job& job) {
    std::lock_guard<std::mutex> lock(m_);
    if (stopped_) return false;
    if (!q_.empty()) {
      job = std::move(q_.front());
      q_.pop_front();
      return true;
    }
    if (!timers_.empty() && timers_.begin()->first <= sim::clock_now()) {
      job = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
      return true;
    }
    return false;
  }

  void loop() {
    tl_in_agent = true;
    const std::function<bool()> ready = [this] {
      std::lock_guard<std::mutex> lock(m_);
      return stopped_ || rearm_ || !q_.empty() || (!timers_.empty() && timers_.begin()->first <= sim::clock_now());
    };
    for (;;) {
      // One message per scheduling point: the seeded scheduler picks which
      // agent, pool thread or worker goes next.
      std::optional<sim::Clock::time_point> deadline;
      {
        std::lock_guard<std::mutex> lock(m_);
        if (stopped_) return;
        if (!timers_.empty()) deadline = timers_.begin()->first;
        deadline_ = deadline;
        rearm_ = false;
      }
      if (!sim::block(ready, deadline, "rpc agent")) {
        // The scheduler let go (the simulation ended or gave up): no more
        // handlers; wait to be stopped.
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stopped_; });
        return;
      }
      Job job;
      if (take(job)) job();
    }
  }

  AgentState st_;
  std::vector<std::weak_ptr<SimAgent>> peers_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stopped_ = false;
  bool rearm_ = false;
  std::optional<sim::Clock::time_point> deadline_;  // the one its task waits with
  std::deque<Job> q_;
  std::multimap<sim::Clock::time_point, Job> timers_;
  std::thread thread_;
};

void sim_send_out(SimAgent& a, OutCallPtr call) {
  a.post([&a, call = std::move(call)] { handle_out(a.state(), a, call); });
}

void sim_send_fin(SimAgent& a, int caller, std::uint64_t id, ReplyPtr r) {
  a.post([&a, caller, id, r = std::move(r)] { handle_fin(a.state(), a, caller, id, r); });
}

void sim_stop(SimAgent& a, bool kill) { a.stop(kill); }

void make_sim_agents(const std::vector<std::shared_ptr<AgentCore>>& cores) {
  std::vector<std::shared_ptr<SimAgent>> agents;
  std::vector<std::weak_ptr<SimAgent>> weak;
  for (const auto& c : cores) {
    agents.push_back(std::make_shared<SimAgent>(c));
    weak.push_back(agents.back());
  }
  for (std::size_t r = 0; r < cores.size(); ++r) {
    agents[r]->set_peers(weak);
    std::lock_guard<std::mutex> lock(cores[r]->mutex);
    cores[r]->sim = agents[r];
  }
}

void start_sim_agent(AgentCore& core) {
  std::shared_ptr<SimAgent> s;
  {
    std::lock_guard<std::mutex> lock(core.mutex);
    s = core.sim;
  }
  if (s) s->start();
}

}  // namespace dopt::rpc::detail
