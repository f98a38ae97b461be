#include "transport/shm/channel.hpp"
#include "dopt/runtime/settings.hpp"

#include <sched.h>
#include <sys/uio.h>

#include <cerrno>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dopt/actors/internal/call_label.hpp"
#include "dopt/actors/internal/sim_hooks.hpp"
#include "dopt/runtime/internal/parallel.hpp"
#include "transport/shm/futex.hpp"

namespace dopt::detail::shm_plane {

namespace {

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 1469598103934665603ULL) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

/// The descriptor back from its shared form (for messages).
CollDesc to_desc(const Desc& d) {
  CollDesc c;
  c.kind = static_cast<CollKind>(d.kind);
  c.op = static_cast<ReduceOp>(d.op);
  c.dtype = static_cast<DType>(d.dtype);
  c.order = static_cast<ReduceOrder>(d.variant & 0x0f);
  c.root = d.root;
  for (int i = 0; i < std::min(d.ndim, kMaxDims); ++i) c.shape.push_back(d.shape[i]);
  c.extra.assign(d.extra, static_cast<std::size_t>(std::clamp<std::int32_t>(d.extra_len, 0, kExtraBytes)));
  c.caller.assign(d.caller, strnlen(d.caller, kCallerBytes));
  return c;
}

bool same(const Desc& a, const Desc& b) {
  return a.seq == b.seq && a.kind == b.kind && a.op == b.op && a.dtype == b.dtype && a.variant == b.variant &&
         a.root == b.root && a.ndim == b.ndim && a.shape_hash == b.shape_hash && a.extra_hash == b.extra_hash;
}

/// The abort flag's value for a member lost elsewhere, and for another
/// error (1: a timeout).
constexpr std::uint32_t kAbortLost = 2;
constexpr std::uint32_t kAbortState = 3;

/// Aborts of groups signalled in this process (simulated waits watch it
/// instead of every member's abort flag).
std::atomic<std::uint64_t> g_aborts{0};

FailKind abort_kind(const ControlBlock& cb) {
  const std::uint32_t v = cb.abort.aborted.load(std::memory_order_acquire);
  return v == kAbortLost ? FailKind::peer_lost : v == kAbortState ? FailKind::state : FailKind::timeout;
}

}  // namespace

WaitPolicy WaitPolicy::for_ranks(int ranks_on_host) {
  WaitPolicy p;
  if (const auto us = settings::integer("DOPT_SHM_SPIN_US")) {  // tuning experiments
    p.spin = std::chrono::microseconds(*us);
    return p;
  }
  const int usable = hardware_threads();
  if (ranks_on_host > usable) {  // a spinning waiter would take the CPU from the rank it waits for
    p.spin = std::chrono::nanoseconds(2000);
    p.yields = 2;
  }
  return p;
}

Channel::Channel(std::uint64_t gid, int me, std::shared_ptr<const std::vector<int>> members, GroupMemory memory,
                 std::shared_ptr<PeerTable> peers, WaitPolicy policy)
    : gid_(gid),
      me_(me),
      members_(std::move(members)),
      memory_(std::move(memory)),
      peers_(std::move(peers)),
      policy_(policy),
      spin_(policy.spin),
      bases_(memory_.base->data()),
      layout_(Layout::of(static_cast<int>(members_->size()), memory_.buf_bytes, memory_.heap_bytes)) {}

std::string Channel::group_str() const { return detail::group_str(gid_); }

std::string Channel::what(const Call& c) const {
  return c.op->desc.str() + " in " + group_str() + " (seq " + std::to_string(c.op->seq) + ")";
}

void Channel::begin_call(Call& c) {
  if (!broken_) {
    if (const int h = aborted_before(c.op->seq); h >= 0) {
      const ControlBlock& cb = ctl(h);
      break_group(Failure{abort_kind(cb), "", std::string(cb.why, strnlen(cb.why, kWhyBytes))});
    }
  }
  if (broken_) {
    Failure f = *broken_;
    f.op = c.name;
    throw_failure(f, my_global());
  }
  c.deadline = sim::clock_now() + c.op->timeout;
  c.first_round = next_round_;
  if (sim::active()) [[unlikely]] check_partition(c);
}

std::uint64_t Channel::begin_round(Call& c) {
  const std::uint64_t k = next_round_++;
  if (k >= 1) wait_all(A(k - 1), c);
  return k;
}

void Channel::signal(std::uint64_t step) {
  if (sim::active()) [[unlikely]] {  // deterministic simulation: a scheduling point (fault plans: late or lost)
    if (sim::on_message("shm step").count() < 0) return;
  }
  SyncLine& s = ctl(me_).sync;
  s.step.store(step, std::memory_order_seq_cst);
  if (memory_.board) memory_.board->reached(me_, step);
  s.futex.fetch_add(1, std::memory_order_seq_cst);
  if (s.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&s.futex, memory_.shared);
}

void Channel::wait_all(std::uint64_t step, Call& c) {
  if (memory_.board && sim::active()) [[unlikely]] {
    if (wait_all_simulated(step, c)) return;
  }
  for (int g = 0; g < size(); ++g)
    if (g != me_) wait(g, step, c);
}

int Channel::first_below(std::uint64_t step) const {
  for (int g = 0; g < size(); ++g)
    if (g != me_ && ctl(g).sync.step.load(std::memory_order_acquire) < step) return g;
  return -1;
}

bool Channel::wait_all_simulated(std::uint64_t step, Call& c) {
  // The Board's least step counts this member too: of use only once its own
  // step is there (a fault plan may have dropped its signal).
  if (ctl(me_).sync.step.load(std::memory_order_acquire) < step) return false;
  const Board& b = *memory_.board;
  check_partition(c);  // no step crosses a partition
  for (;;) {
    if (b.least() >= step) return true;
    // What wait_simulated does, on the first member still below the step
    // (the one a wait for each member in turn would be on): only when a
    // wait ends without the step is it looked for.
    const std::uint64_t gen = peers_->generation();
    const std::uint64_t aborts = g_aborts.load(std::memory_order_acquire);
    if (aborted_before(c.op->seq) >= 0) check_slow(std::max(0, first_below(step)), step, c);  // throws
    const std::function<bool()> ready = [&] {
      return b.least() >= step || peers_->generation() != gen || g_aborts.load(std::memory_order_acquire) != aborts;
    };
    const bool simulated = sim::block(ready, c.deadline, "shm wait");
    if (b.least() >= step) return true;
    if (!simulated) return false;  // the simulation let go: wait as usual
    check_partition(c);
    const int g = first_below(step);
    if (g < 0) return true;
    check_slow(g, step, c);  // throws on an abort, a lost peer, the deadline
  }
}

void Channel::wait(int g, std::uint64_t step, Call& c) {
  SyncLine& s = ctl(g).sync;
  if (sim::active()) [[unlikely]] check_partition(c);  // no step crosses a partition
  if (s.step.load(std::memory_order_acquire) >= step) return;
  if (sim::active()) [[unlikely]] {
    if (wait_simulated(g, step, c)) return;
  }
  // Poll for up to spin_ (the clock is read every 64 polls), yielding the
  // CPU every few microseconds: a peer that shares this core then runs.
  if (++waits_ % 64 == 0) spin_ = policy_.spin;
  auto t = std::chrono::steady_clock::now();
  const auto spin_end = t + spin_;
  auto next_yield = t + std::chrono::microseconds(2);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (s.step.load(std::memory_order_acquire) >= step) {
        spin_ = policy_.spin;
        return;
      }
    }
    t = std::chrono::steady_clock::now();
    if (t >= spin_end) break;
    if (t >= next_yield) {
      ::sched_yield();
      next_yield = t + std::chrono::microseconds(2);
    }
  }
  spin_ = std::max<std::chrono::nanoseconds>(std::chrono::nanoseconds(1000), spin_ / 2);
  for (int i = 0; i < policy_.yields; ++i) {
    ::sched_yield();
    if (s.step.load(std::memory_order_acquire) >= step) return;
  }
  for (;;) {
    check_slow(g, step, c);
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(c.deadline - std::chrono::steady_clock::now());
    const auto nap = std::clamp(left, std::chrono::microseconds(1), policy_.slice);
    const std::uint32_t f = s.futex.load(std::memory_order_seq_cst);
    s.waiters.fetch_add(1, std::memory_order_seq_cst);
    if (s.step.load(std::memory_order_seq_cst) >= step) {
      s.waiters.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    futex_wait(&s.futex, f, nap, memory_.shared);
    s.waiters.fetch_sub(1, std::memory_order_relaxed);
    if (s.step.load(std::memory_order_acquire) >= step) return;
  }
}

bool Channel::wait_simulated(int g, std::uint64_t step, Call& c) {
  SyncLine& s = ctl(g).sync;
  for (;;) {
    const std::uint64_t gen = peers_->generation();
    const std::uint64_t aborts = g_aborts.load(std::memory_order_acquire);
    if (aborted_before(c.op->seq) >= 0) check_slow(g, step, c);  // throws
    // Wakes on the step, a change of the peers, or any abort in the process
    // (then check_slow below decides whether it ends this wait).
    const std::function<bool()> ready = [&] {
      return s.step.load(std::memory_order_acquire) >= step || peers_->generation() != gen ||
             g_aborts.load(std::memory_order_acquire) != aborts;
    };
    const bool simulated = sim::block(ready, c.deadline, "shm wait");
    if (s.step.load(std::memory_order_acquire) >= step) return true;
    if (!simulated) return false;  // the simulation let go: wait as usual
    check_partition(c);            // one that began during the wait
    check_slow(g, step, c);        // throws on an abort, a lost peer, the deadline
  }
}

void Channel::check_partition(Call& c) {
  if (!sim::any_partition()) return;
  for (int h = 0; h < size(); ++h) {
    if (h == me_) continue;
    const std::string why = sim::partition_between(my_global(), global(h));
    if (why.empty()) continue;
    // Nothing crosses: to this side h is lost once the call's time is up
    // (no abort is signalled to the group: it would cross the partition).
    static const std::function<bool()> never = [] { return false; };
    sim::block(never, c.deadline, "partitioned collective");
    sim::lost_to_partition(my_global(), global(h), what(c) + " of rank " + std::to_string(my_global()), why);
    Failure f{FailKind::peer_lost, c.name, "rank " + std::to_string(global(h)) + " was lost during " + what(c) + ": " + why};
    break_group(f);
    throw_failure(f, my_global());
  }
}

void Channel::check_slow(int g, std::uint64_t step, Call& c) {
  if (peers_->shutting_down())
    throw StateError(c.name, "the runtime shut down before the operation finished", my_global());
  if (const int h = aborted_before(c.op->seq); h >= 0) {
    const ControlBlock& cb = ctl(h);
    std::string why(cb.why, strnlen(cb.why, kWhyBytes));
    Failure f{abort_kind(cb), c.name, why};
    break_group(f);
    throw_failure(f, my_global());
  }
  // A lost member: the awaited one, or any other that will never reach this
  // member's round (every member takes part in every round), so that a
  // survivor waiting on another survivor does not wait out the deadline.
  if (const int h = unable_member(g, c); h >= 0) {
    // g reached the step and then went (its call done, its process ended):
    // its state was read first, so a step it signalled before is seen here.
    if (h == g && step > 0 && ctl(g).sync.step.load(std::memory_order_acquire) >= step) return;
    fail_lost(global(h), c);
  }
  if (sim::clock_now() >= c.deadline) fail_timeout(step, c);
}

int Channel::unable_member(int g, const Call& c) const {
  // The awaited member g: lost, or failed before it submitted this call.
  // Any other member h: the same, but a lost h only when it did not reach
  // this member's current round (one that finished the call and then went,
  // e.g. shut down, did its part).
  const std::uint64_t here = next_round_ == 0 ? 0 : A(next_round_ - 1);
  for (int i = 0; i < size(); ++i) {
    const int h = i == 0 ? g : (i == g ? 0 : i);  // g first
    if (h == me_) continue;
    const auto st = peers_->state(global(h));
    if (st == PeerTable::alive) continue;
    if (st == PeerTable::failed && ctl(h).status.submitted.load(std::memory_order_acquire) <= c.op->seq) return h;
    if (st == PeerTable::lost && (h == g || ctl(h).sync.step.load(std::memory_order_acquire) < here)) return h;
  }
  return -1;
}

void Channel::fail_lost(int peer_global, Call& c) {
  // Name the first member that was lost (the cause), not merely the one
  // this wait was on.
  for (int q : peers_->order()) {
    if (q == my_global() || std::find(members_->begin(), members_->end(), q) == members_->end()) continue;
    peer_global = q;
    break;
  }
  const int pg = static_cast<int>(std::find(members_->begin(), members_->end(), peer_global) - members_->begin());
  const bool joined = pg < size() && ctl(pg).sync.step.load(std::memory_order_acquire) >= A(c.first_round);
  const std::string msg = "rank " + std::to_string(peer_global) + " was lost " + (joined ? "during " : "before it joined ") +
                          what(c) + ": " + peers_->why(peer_global);
  Failure f{FailKind::peer_lost, c.name, msg};
  // Every other member's waits on this group (those on this member too, who
  // may not know of the loss yet) end with this reason, and so do its calls.
  abort_group(msg, FailKind::peer_lost, c.op->seq);
  throw_failure(f, my_global());
}

void Channel::fail_timeout(std::uint64_t step, Call& c) {
  std::string who;
  for (int g = 0; g < size(); ++g)
    if (g != me_ && ctl(g).sync.step.load(std::memory_order_acquire) < A(c.first_round))
      who += " " + std::to_string(global(g));
  who = who.empty() ? std::string("peers did not finish") : "rank(s)" + who + " did not join";
  (void)step;
  const std::string msg = "timed out after " + std::to_string(c.op->timeout.count()) + " ms in " + c.op->desc.str() +
                          " (" + group_str() + ", seq " + std::to_string(c.op->seq) + "): " + who;
  const std::string later =
      group_str() + " is unusable after a timeout on rank " + std::to_string(my_global()) + ": " + msg;
  abort_group(later, FailKind::timeout, c.op->seq);
  throw TimeoutError(c.name, msg, my_global());
}

void Channel::abort_group(const std::string& later, FailKind kind, std::uint64_t seq) {
  // Tell the peers first: their waits on this group end with our reason.
  ControlBlock& mine = ctl(me_);
  if (mine.abort.aborted.load(std::memory_order_acquire) == 0) {
    const std::size_t n = std::min(later.size(), kWhyBytes - 1);
    std::memcpy(mine.why, later.data(), n);
    mine.why[n] = '\0';
    mine.abort.seq.store(seq, std::memory_order_relaxed);
    mine.abort.aborted.store(kind == FailKind::peer_lost ? kAbortLost : kind == FailKind::state ? kAbortState : 1,
                             std::memory_order_release);
    if (memory_.board) memory_.board->aborted();
    g_aborts.fetch_add(1, std::memory_order_acq_rel);
    signal(mine.sync.step.load(std::memory_order_relaxed));  // wakes sleepers, who then see the abort
  }
  break_group(Failure{kind, "", later});
}

void Channel::publish(std::uint64_t round, const Op& op) {
  Desc& d = ctl(me_).desc[round % 2];
  d.seq = op.seq;
  d.kind = static_cast<std::uint8_t>(op.desc.kind);
  d.op = static_cast<std::uint8_t>(op.desc.op);
  d.dtype = static_cast<std::uint8_t>(op.desc.dtype);
  d.variant = static_cast<std::uint8_t>(static_cast<unsigned>(op.desc.order) | (op.desc.pre_divisor > 0 ? 0x10u : 0u));
  d.root = op.desc.root;
  d.ndim = static_cast<std::int32_t>(op.desc.shape.size());
  std::uint64_t h = fnv1a(&d.ndim, sizeof d.ndim);
  for (std::size_t i = 0; i < op.desc.shape.size(); ++i) {
    if (i < static_cast<std::size_t>(kMaxDims)) d.shape[i] = op.desc.shape[i];
    h = fnv1a(&op.desc.shape[i], sizeof op.desc.shape[i], h);
  }
  h = fnv1a(&op.desc.pre_divisor, sizeof op.desc.pre_divisor, h);
  d.shape_hash = h;
  d.extra_hash = fnv1a(op.desc.extra.data(), op.desc.extra.size());
  d.extra_len = static_cast<std::int32_t>(std::min(op.desc.extra.size(), kExtraBytes));
  std::memcpy(d.extra, op.desc.extra.data(), static_cast<std::size_t>(d.extra_len));
  const std::size_t nc = std::min(op.desc.caller.size(), kCallerBytes - 1);
  std::memcpy(d.caller, op.desc.caller.data(), nc);
  d.caller[nc] = '\0';
  d.op_ptr = reinterpret_cast<std::uint64_t>(&op);
  d.data_addr = op.tensors.empty() ? 0 : reinterpret_cast<std::uint64_t>(op.tensors[0].data_ptr());
}

std::uint64_t Channel::meet(Call& c) {
  const std::uint64_t k = begin_round(c);
  publish(k, *c.op);
  signal(A(k));
  wait_all(A(k), c);
  match(k, c);
  return k;
}

void Channel::sync(Call& c) {
  const std::uint64_t k = begin_round(c);
  signal(A(k));
  wait_all(A(k), c);
}

void Channel::match(std::uint64_t round, Call& c) {
  const std::string m = mismatch(round, c);
  if (!m.empty()) throw CollectiveMismatchError(c.name, m, my_global());
}

void Channel::check(Call& c) {
  if (peers_->shutting_down())
    throw StateError(c.name, "the runtime shut down before the operation finished", my_global());
  if (const int h = aborted_before(c.op->seq); h >= 0) {
    const ControlBlock& cb = ctl(h);
    Failure f{abort_kind(cb), c.name, std::string(cb.why, strnlen(cb.why, kWhyBytes))};
    break_group(f);
    throw_failure(f, my_global());
  }
  if (sim::clock_now() >= c.deadline) fail_timeout(0, c);
}

std::string Channel::mismatch(std::uint64_t round, Call& c) {
  // Threads: one member compares them all for every member.
  Board* const board = memory_.board.get();
  if (board && board->matched(round)) return "";
  const Desc& ref = ctl(0).desc[round % 2];
  for (int g = 1; g < size(); ++g) {
    const Desc& d = ctl(g).desc[round % 2];
    if (same(ref, d)) continue;
    if (d.seq != ref.seq) {
      Failure f{FailKind::state, c.name,
                group_str() + ": ranks out of step (rank " + std::to_string(global(0)) + " at seq " +
                    std::to_string(ref.seq) + ", rank " + std::to_string(global(g)) + " at seq " + std::to_string(d.seq) +
                    ")"};
      break_group(f);
      throw_failure(f, my_global());
    }
    std::vector<std::pair<int, std::string>> calls;
    for (int m = 0; m < size(); ++m) calls.emplace_back(global(m), to_desc(ctl(m).desc[round % 2]).caller);
    return mismatch_text(calls, "collective mismatch in " + group_str() + " at seq " + std::to_string(c.op->seq) +
                                    ": rank " + std::to_string(global(0)) + " called " + to_desc(ref).str() +
                                    " but rank " + std::to_string(global(g)) + " called " + to_desc(d).str());
  }
  if (board) board->set_matched(round);
  return "";
}

const Op& Channel::peer_op(int g, std::uint64_t round) const {
  return *reinterpret_cast<const Op*>(ctl(g).desc[round % 2].op_ptr);
}

void Channel::note_submitted(std::uint64_t seq) {
  auto& s = ctl(me_).status.submitted;
  std::uint64_t cur = s.load(std::memory_order_relaxed);
  while (cur < seq + 1 && !s.compare_exchange_weak(cur, seq + 1, std::memory_order_release)) {
  }
}

void Channel::note_dropped(std::uint64_t seq) {
  auto& s = ctl(me_).status.submitted;
  std::uint64_t cur = s.load(std::memory_order_relaxed);
  while (cur > seq && !s.compare_exchange_weak(cur, seq, std::memory_order_release)) {
  }
}

void Channel::break_group(const Failure& f) {
  if (!broken_) broken_ = f;
}

int Channel::aborted_before(std::uint64_t seq) const {
  // Threads of one process: the Board counts the members' aborts (each
  // after its abort line is set): while none did, no line is read.
  if (memory_.board && memory_.board->aborts() == 0) return -1;
  for (int h = 0; h < size(); ++h)
    if (h != me_ && ctl(h).abort.aborted.load(std::memory_order_acquire) != 0 &&
        ctl(h).abort.seq.load(std::memory_order_relaxed) <= seq)
      return h;
  return -1;
}

// --- cross-memory attach ---------------------------------------------------------

void Channel::probe_cma(bool wanted, bool p2p) {
  bool ok = (wanted || p2p) && memory_.shared && !memory_.in_process;
  for (int g = 0; ok && g < size(); ++g) {
    if (g == me_) continue;
    const ControlBlock& cb = ctl(g);
    std::uint64_t magic = 0;
    iovec local{&magic, sizeof magic};
    iovec remote{reinterpret_cast<void*>(cb.self_addr), sizeof magic};
    ok = cb.self_addr != 0 && ::process_vm_readv(cb.pid, &local, 1, &remote, 1, 0) == sizeof magic &&
         magic == kRegionMagic;
  }
  ctl(me_).p2p_cma.store(ok && p2p ? 1u : 2u, std::memory_order_release);
  ctl(me_).cma.store(ok && wanted ? 1u : 2u, std::memory_order_release);
}

bool Channel::cma_ready() {
  if (cma_all_) return true;
  if (next_round_ == 0) return false;
  for (int g = 0; g < size(); ++g)
    if (ctl(g).cma.load(std::memory_order_acquire) != 1) return false;
  return cma_all_ = true;
}

bool Channel::p2p_cma_ready() {
  if (p2p_cma_all_) return true;
  if (!memory_.shared || memory_.in_process) return false;
  for (int g = 0; g < size(); ++g)
    if (ctl(g).p2p_cma.load(std::memory_order_acquire) != 1) return false;
  return p2p_cma_all_ = true;
}

std::uint64_t Channel::peer_data(int g, std::uint64_t round) const { return ctl(g).desc[round % 2].data_addr; }

void Channel::cma_read(int g, std::uint64_t remote, char* dst, std::size_t n, Call& c) {
  const pid_t pid = ctl(g).pid;
  while (n > 0) {
    // At most 64 MiB a call, so that a lost peer is noticed between calls.
    const std::size_t part = std::min<std::size_t>(n, std::size_t{64} << 20);
    iovec local{dst, part};
    iovec rem{reinterpret_cast<void*>(remote), part};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &rem, 1, 0);
    if (got <= 0) {
      const int err = errno;
      // The process is gone (ESRCH) or its memory is (EFAULT): it died. Wait
      // for the liveness verdict, so that every survivor fails the same way
      // (PeerLostError naming it), bounded by the call's deadline.
      while (err == ESRCH || err == EFAULT) {
        check_slow(g, 0, c);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      check_slow(g, 0, c);  // a lost or aborted member: its own error
      throw StateError(c.name, "cannot read rank " + std::to_string(global(g)) + "'s memory in " + what(c) + ": " +
                                   std::strerror(err) + " (set DOPT_SHM_CMA=0 to copy through shared memory)",
                       my_global());
    }
    dst += got;
    remote += static_cast<std::uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
}

}  // namespace dopt::detail::shm_plane
