// send and recv under the fault plan (p2p.hpp).
#include "sim/p2p.hpp"

#include <exception>
#include <string>
#include <thread>

#include "dopt/runtime/error.hpp"
#include "sim/scheduler.hpp"

namespace dopt::detail::sim {

namespace {

int my_global(const Op& op) { return (*op.members)[static_cast<std::size_t>(op.my_grank)]; }

std::string no_reply(const Op& op, const std::string& why, const char* what) {
  return why + "; " + what + " within the timeout of " + std::to_string(op.timeout.count()) + " ms";
}

}  // namespace

Future<void> faulty_send(std::shared_ptr<Op> op, std::function<Future<void>(std::shared_ptr<Op>)> post) {
  Task* me = tl_task;
  if (!me || me->sched->over()) return post(std::move(op));
  Scheduler& s = *me->sched;
  const auto f = s.send_fault(me, my_global(*op), op->peer, op->tag);
  if (!f.lost && f.hold.count() <= 0) return post(std::move(op));
  auto fut = op->promise.get_future();
  const auto hold = f.lost ? std::chrono::duration_cast<std::chrono::nanoseconds>(op->timeout) : f.hold;
  const Clock::time_point at = s.now() + std::chrono::duration_cast<Clock::duration>(hold);
  // A helper task of the rank holds the message back in virtual time.
  std::thread th = spawn([op, post = std::move(post), f, at] {
    static const std::function<bool()> never = [] { return false; };
    block(never, at, f.lost ? "lost send" : "delayed send");
    if (f.lost) {
      op->promise.set_exception(std::make_exception_ptr(
          PeerLostError(op->desc.who(), no_reply(*op, f.why, "the send got no acknowledgement"), my_global(*op))));
      return;
    }
    try {
      post(op);
    } catch (const std::exception&) {
      op->promise.set_exception(std::current_exception());
    }
  }, f.lost ? "lost send" : "delayed send");
  th.detach();
  return fut;
}

Future<void> faulty_recv(const Op& op, Future<void> posted) {
  Task* me = tl_task;
  if (!me || me->sched->over()) return posted;
  std::weak_ptr<Scheduler> weak = me->sched->shared_from_this();
  const int src = op.peer, dst = my_global(op);
  const std::string who = op.desc.who();
  const auto timeout = op.timeout;
  return posted.then([weak, src, dst, who, timeout](const Future<void>& f) {
    try {
      f.get();
    } catch (const TimeoutError&) {
      auto s = weak.lock();
      const std::string why = s ? s->link_lost(src, dst) : std::string();
      if (why.empty()) throw;
      throw PeerLostError(who, why + "; nothing arrived within the timeout of " + std::to_string(timeout.count()) + " ms",
                          dst);
    }
  });
}

}  // namespace dopt::detail::sim
