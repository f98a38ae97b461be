#include "transport/shm/p2p.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <sys/mman.h>
#include <sys/uio.h>

#include <cstdint>
#include <cstring>

#include "dopt/actors/internal/sim_hooks.hpp"
#include "plane/failure.hpp"
#include "transport/shm/futex.hpp"

namespace dopt::detail::shm_plane {

namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t shape_hash(const Shape& s) {
  std::uint64_t h = 1469598103934665603ULL ^ s.size();
  for (auto d : s) h = (h ^ static_cast<std::uint64_t>(d)) * 1099511628211ULL;
  return h;
}

Shape shape_of(const MailSlot& m) {
  Shape s;
  for (int i = 0; i < std::min<int>(m.ndim, kMaxDims); ++i) s.push_back(m.shape[i]);
  return s;
}

void ring(Doorbell* d, bool shared) {
  d->ring.fetch_add(1, std::memory_order_seq_cst);
  if (d->sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&d->ring, shared);
}

}  // namespace

struct P2PEngine::State {
  // Fixed after construction.
  std::vector<void*> bases;           // index: group rank
  std::vector<int> members;           // global ranks
  int me = 0;
  Layout layout;
  bool shared = false;                // other processes: stage through the arena
  std::shared_ptr<PeerTable> peers;
  std::shared_ptr<void> keep;         // the regions' mappings
  std::uint64_t gid = 0;

  std::mutex mutex;                   // guards `incoming`, `stopping`
  std::deque<OpPtr> incoming;         // posted, not yet seen by the engine
  bool stopping = false;
  std::string stop_why;

  // The engine thread's own state (no lock).
  struct Send {
    OpPtr op;
    Clock::time_point deadline;
    std::uint64_t id = 0;             // 0: not yet published
    Tensor stage;                     // processes: the staged copy (an arena block)
    std::size_t heap_off = static_cast<std::size_t>(-1);  // processes: or a block of the send heap
    std::size_t heap_len = 0;
    bool timed_out = false;           // withdrawn: only waiting for the ack to free the stage
  };
  struct Recv {
    OpPtr op;
    Clock::time_point deadline;
  };
  struct Header {
    std::uint64_t id = 0;
    int tag = 0;
    std::uint64_t seq = 0;
    DType dtype = DType::float32;
    Shape shape;
    std::uint64_t hash = 0;
    std::uint64_t nbytes = 0, addr = 0, offset = 0;
    bool direct = false;  // processes: read addr in the sender's memory (process_vm_readv)
    std::string segment;
  };
  std::vector<std::deque<Send>> queued;        // [dst]: not yet published, in post order
  std::vector<std::map<std::uint64_t, Send>> sent;  // [dst]: published, by id
  std::vector<std::uint64_t> next_id;          // [dst]
  std::vector<std::uint64_t> read_next;        // [src]
  std::vector<std::deque<Header>> unexpected;  // [src]: headers not yet matched
  std::vector<PeerTable::State> states;       // [g]: read at the start of each step()
  std::vector<Recv> recvs;                     // posted, in post order
  std::unique_ptr<shm::ShmArena> arena;  // messages larger than the heap's free space
  shm::ShmMapCache maps;
  std::map<std::size_t, std::size_t> heap_free;  // offset -> bytes, of this rank's send heap

  /// A block of this rank's send heap (npos when none is free), first fit.
  std::size_t heap_alloc(std::size_t bytes) {
    bytes = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
    for (auto it = heap_free.begin(); it != heap_free.end(); ++it) {
      if (it->second < bytes) continue;
      const std::size_t off = it->first, left = it->second - bytes;
      heap_free.erase(it);
      if (left) heap_free.emplace(off + bytes, left);
      return off;
    }
    return static_cast<std::size_t>(-1);
  }
  void heap_release(std::size_t off, std::size_t bytes) {
    bytes = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
    // Large blocks give their memory back (the peer read them already).
    if (bytes >= (1u << 20)) {
      char* p = layout.heap_of(bases[static_cast<std::size_t>(me)]) + off;
      char* lo = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(p) + 4095) / 4096 * 4096);
      char* hi = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(p + bytes)) / 4096 * 4096);
      if (hi > lo) ::madvise(lo, static_cast<std::size_t>(hi - lo), MADV_REMOVE);
    }
    auto it = heap_free.emplace(off, bytes).first;
    if (auto next = std::next(it); next != heap_free.end() && it->first + it->second == next->first) {
      it->second += next->second;
      heap_free.erase(next);
    }
    if (it != heap_free.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        heap_free.erase(it);
      }
    }
  }

  int grank_of(int global) const {
    return static_cast<int>(std::find(members.begin(), members.end(), global) - members.begin());
  }
  Doorbell* doorbell(int g) const { return layout.doorbell_of(bases[static_cast<std::size_t>(g)]); }
  const ControlBlock& ctl(int g) const { return *static_cast<const ControlBlock*>(bases[static_cast<std::size_t>(g)]); }
  /// Processes: member d can read this process's memory (its CMA probe of
  /// every member worked), so a send to d needs no staged copy.
  bool reads_me(int d) const { return shared && ctl(d).p2p_cma.load(std::memory_order_acquire) == 1; }
  /// Copies a direct message's bytes from member src's memory. Returns "" or
  /// why it could not (ESRCH/EFAULT: the sender is gone).
  std::string read_direct(int src, const Header& h, void* dst, bool& gone);

  void loop();
  bool step(Clock::time_point now);
  /// The doorbell sleep under the deterministic scheduler: until a ring, a
  /// change of liveness or the earliest deadline (false: the simulation let go).
  bool sleep_simulated(std::uint32_t seen);
  void fail(const OpPtr& op, const Failure& f) { op->promise.set_exception(to_exception(f, members[static_cast<std::size_t>(me)])); }
  bool publish(int d, Send& s);
  void complete_recv(const Recv& r, int src, const Header& h);
  void ack(int src, std::uint64_t id, AckStatus st, const std::string& why);
  void fail_all(const std::string& why);
};

P2PEngine::P2PEngine(const Channel& ch) : s_(std::make_shared<State>()) {
  State& s = *s_;
  for (int g = 0; g < ch.size(); ++g) {
    s.bases.push_back(ch.base(g));
    s.members.push_back(ch.global(g));
  }
  s.me = ch.me();
  s.layout = ch.layout();
  s.shared = ch.shared();
  s.peers = ch.peers();
  s.gid = ch.gid();
  const auto n = static_cast<std::size_t>(ch.size());
  s.queued.resize(n);
  s.sent.resize(n);
  s.next_id.assign(n, 1);
  s.read_next.assign(n, 1);
  s.unexpected.resize(n);
  s.states.assign(n, PeerTable::alive);
  if (s.layout.heap_bytes) s.heap_free.emplace(0, s.layout.heap_bytes);
}

P2PEngine::~P2PEngine() {
  stop("the process group was destroyed before the operation finished");
  sim::release_thread(thread_);
}

void P2PEngine::stop(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(s_->mutex);
    if (!s_->stopping) {
      s_->stopping = true;
      s_->stop_why = why;
    }
  }
  ring(s_->doorbell(s_->me), s_->shared);
  if (!thread_.joinable()) s_->fail_all(why);  // no engine to do it
}

Future<void> P2PEngine::post(const OpPtr& op) {
  auto fut = op->promise.get_future();
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(s_->mutex);
    if (s_->stopping) {
      refused = s_->stop_why;
    } else {
      s_->incoming.push_back(op);
      if (!thread_.joinable()) thread_ = sim::make_thread([st = s_] { st->loop(); }, "p2p engine");
    }
  }
  if (!refused.empty()) {
    op->promise.set_exception(std::make_exception_ptr(StateError(op->desc.who(), refused, s_->members[static_cast<std::size_t>(s_->me)])));
    return fut;
  }
  ring(s_->doorbell(s_->me), s_->shared);
  return fut;
}

void P2PEngine::State::fail_all(const std::string& why) {
  std::deque<OpPtr> in;
  {
    std::lock_guard<std::mutex> lock(mutex);
    in.swap(incoming);
  }
  const Failure f{FailKind::state, "", why};
  auto failop = [&](const OpPtr& op) {
    Failure g = f;
    g.op = op->desc.who();
    fail(op, g);
  };
  for (auto& op : in) failop(op);
  for (auto& q : queued) {
    for (auto& x : q) failop(x.op);
    q.clear();
  }
  for (auto& m : sent) {
    for (auto& [id, x] : m)
      if (!x.timed_out) failop(x.op);
    m.clear();
  }
  for (auto& r : recvs) failop(r.op);
  recvs.clear();
}

void P2PEngine::State::loop() {
  Doorbell* bell = doorbell(me);
  for (;;) {
    const std::uint32_t seen = bell->ring.load(std::memory_order_seq_cst);
    bool stop_now = false;
    std::deque<OpPtr> fresh;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop_now = stopping;
      fresh.swap(incoming);
    }
    if (stop_now) {
      fail_all(stop_why);
      return;
    }
    const auto now = sim::clock_now();
    for (auto& op : fresh) {
      const int peer = grank_of(op->peer);
      if (op->desc.kind == CollKind::send) queued[static_cast<std::size_t>(peer)].push_back(Send{op, now + op->timeout, 0, {}, false});
      else recvs.push_back(Recv{op, now + op->timeout});
    }
    bool busy = step(now);
    if (busy) continue;
    if (sim::active()) [[unlikely]] {
      if (sleep_simulated(seen)) continue;
    }
    // Idle: sleep on the doorbell until a peer (or a local post) rings it,
    // or until the next liveness / deadline check.
    bell->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (bell->ring.load(std::memory_order_seq_cst) == seen) {
      const bool pending = !recvs.empty() || std::any_of(sent.begin(), sent.end(), [](auto& m) { return !m.empty(); }) ||
                           std::any_of(queued.begin(), queued.end(), [](auto& q) { return !q.empty(); });
      futex_wait(&bell->ring, seen, pending ? std::chrono::microseconds(2000) : std::chrono::microseconds(50000), shared);
    }
    bell->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

bool P2PEngine::State::sleep_simulated(std::uint32_t seen) {
  std::optional<Clock::time_point> deadline;
  auto earlier = [&](Clock::time_point t) {
    if (!deadline || t < *deadline) deadline = t;
  };
  for (auto& q : queued)
    for (auto& x : q) earlier(x.deadline);
  for (auto& m : sent)
    for (auto& [id, x] : m)
      if (!x.timed_out) earlier(x.deadline);
  for (auto& r : recvs) earlier(r.deadline);
  Doorbell* bell = doorbell(me);
  const std::uint64_t gen = peers->generation();
  const std::function<bool()> ready = [&] {
    return bell->ring.load(std::memory_order_acquire) != seen || peers->generation() != gen;
  };
  return sim::block(ready, deadline, "p2p doorbell");
}

bool P2PEngine::State::publish(int d, Send& s) {
  const std::uint64_t id = next_id[static_cast<std::size_t>(d)];
  // The window: the slot (and the ack slot) of id - kMailSlots must be free.
  auto& unacked = sent[static_cast<std::size_t>(d)];
  if (!unacked.empty() && unacked.begin()->first + kMailSlots <= id) return false;
  void* peer_base = bases[static_cast<std::size_t>(d)];
  if (id > kMailSlots && layout.read_line(peer_base, me)->read_upto.load(std::memory_order_acquire) < id - kMailSlots)
    return false;
  const Op& op = *s.op;
  const Tensor& t = op.tensors[0];
  MailSlot* m = layout.mail_slot(bases[static_cast<std::size_t>(me)], d, id);
  m->cancelled.store(0, std::memory_order_relaxed);
  m->tag = op.tag;
  m->seq = op.seq;
  m->dtype = static_cast<std::uint8_t>(t.dtype());
  m->ndim = static_cast<std::int8_t>(std::min<std::size_t>(t.shape().size(), 127));
  for (std::size_t i = 0; i < t.shape().size() && i < static_cast<std::size_t>(kMaxDims); ++i) m->shape[i] = t.shape()[i];
  m->shape_hash = shape_hash(t.shape());
  m->nbytes = t.nbytes();
  m->direct = 0;
  if (shared && reads_me(d)) {
    // The receiver copies straight from this tensor (one copy instead of a
    // staged one and a copy out); the op keeps it alive until the ack.
    std::memset(m->segment, 0, sizeof m->segment);
    m->addr = reinterpret_cast<std::uint64_t>(t.data_ptr());
    m->direct = 1;
  } else if (shared) {
    std::memset(m->segment, 0, sizeof m->segment);
    std::size_t off = heap_alloc(t.nbytes());
    // A heap block is backed before it is written (a full /dev/shm would
    // raise SIGBUS in the memcpy); one that cannot be goes to the arena,
    // whose segment is reserved whole or fails naming /dev/shm.
    if (off != static_cast<std::size_t>(-1) &&
        !shm::populate(layout.heap_of(bases[static_cast<std::size_t>(me)]) + off, t.nbytes())) {
      heap_release(off, t.nbytes());
      off = static_cast<std::size_t>(-1);
    }
    if (off != static_cast<std::size_t>(-1)) {  // the send heap (mapped by every member, nameless)
      if (t.nbytes()) std::memcpy(layout.heap_of(bases[static_cast<std::size_t>(me)]) + off, t.data_ptr(), t.nbytes());
      m->offset = off;
      s.heap_off = off;
      s.heap_len = t.nbytes();
    } else {  // larger than what is free: a segment of its own
      if (!arena) arena = std::make_unique<shm::ShmArena>("p" + std::to_string(members[static_cast<std::size_t>(me)]));
      auto blk = arena->allocate(t.nbytes());
      if (t.nbytes()) std::memcpy(blk->ptr, t.data_ptr(), t.nbytes());
      std::strncpy(m->segment, blk->ref.segment.c_str(), sizeof m->segment - 1);
      m->offset = blk->ref.offset;
      void* p = blk->ptr;
      s.stage = Tensor::from_blob(p, t.shape(), t.dtype(), Device::cpu(), std::shared_ptr<void>(std::move(blk)));
    }
  } else {
    m->addr = reinterpret_cast<std::uint64_t>(t.data_ptr());
  }
  m->id.store(id, std::memory_order_release);
  s.id = id;
  next_id[static_cast<std::size_t>(d)] = id + 1;
  ring(doorbell(d), shared);
  return true;
}

void P2PEngine::State::ack(int src, std::uint64_t id, AckStatus st, const std::string& why) {
  AckSlot* a = layout.ack_slot(bases[static_cast<std::size_t>(me)], src, id);
  a->status = static_cast<std::uint32_t>(st);
  const std::size_t n = std::min(why.size(), sizeof a->why - 1);
  std::memcpy(a->why, why.data(), n);
  a->why[n] = '\0';
  a->id.store(id, std::memory_order_release);
  ring(doorbell(src), shared);
}

void P2PEngine::State::complete_recv(const Recv& r, int src, const Header& h) {
  const Op& op = *r.op;
  const Tensor& dst = op.tensors[0];
  if (h.dtype != dst.dtype() || h.hash != shape_hash(dst.shape())) {
    const std::string msg = "rank " + std::to_string(members[static_cast<std::size_t>(src)]) + " sent " +
                            std::string(dtype_name(h.dtype)) + " " + shape_str(h.shape) + " (tag " +
                            std::to_string(h.tag) + ") but rank " + std::to_string(members[static_cast<std::size_t>(me)]) +
                            " receives into " + std::string(dtype_name(dst.dtype())) + " " + shape_str(dst.shape());
    fail(r.op, Failure{FailKind::mismatch, "recv", msg});
    ack(src, h.id, AckStatus::mismatch, msg);
    return;
  }
  if (shared && h.direct) {
    bool gone = false;
    const std::string why = read_direct(src, h, dst.data_ptr(), gone);
    if (!why.empty()) {
      const std::string msg = std::string("cannot read the sent bytes: ") + why;
      fail(r.op, Failure{gone ? FailKind::peer_lost : FailKind::state, "recv", msg});
      if (!gone) ack(src, h.id, AckStatus::receiver_failed, msg);
      return;
    }
    // A send withdrawn (timed out) while it was read: its tensor may have
    // changed under the copy, so the bytes are not taken.
    const MailSlot* m = layout.mail_slot(bases[static_cast<std::size_t>(src)], me, h.id);
    if (m->id.load(std::memory_order_acquire) == h.id && m->cancelled.load(std::memory_order_acquire)) {
      fail(r.op, Failure{FailKind::timeout, "recv",
                         "rank " + std::to_string(members[static_cast<std::size_t>(src)]) +
                             " withdrew the message (its send timed out) while it was read (tag " +
                             std::to_string(h.tag) + ")"});
      ack(src, h.id, AckStatus::cancelled, "");
      return;
    }
    ack(src, h.id, AckStatus::ok, "");
    r.op->promise.set_value();
    return;
  }
  try {
    const void* from = nullptr;
    std::shared_ptr<void> keep;
    if (!shared) from = reinterpret_cast<const void*>(h.addr);
    else if (h.segment.empty()) from = layout.heap_of(bases[static_cast<std::size_t>(src)]) + h.offset;
    else from = maps.resolve(shm::BlockRef{h.segment, h.offset, h.nbytes}, &keep);
    if (h.nbytes) std::memcpy(dst.data_ptr(), from, h.nbytes);
  } catch (const std::exception& e) {
    const std::string msg = std::string("cannot read the sent bytes: ") + e.what();
    fail(r.op, Failure{FailKind::state, "recv", msg});
    ack(src, h.id, AckStatus::receiver_failed, msg);
    return;
  }
  ack(src, h.id, AckStatus::ok, "");
  r.op->promise.set_value();
}

std::string P2PEngine::State::read_direct(int src, const Header& h, void* dst, bool& gone) {
  const pid_t pid = ctl(src).pid;
  char* to = static_cast<char*>(dst);
  std::uint64_t from = h.addr, left = h.nbytes;
  while (left > 0) {
    // At most 64 MiB a call, so that a sender that died is noticed between calls.
    const std::size_t part = static_cast<std::size_t>(std::min<std::uint64_t>(left, std::uint64_t{64} << 20));
    iovec local{to, part};
    iovec remote{reinterpret_cast<void*>(from), part};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      const int err = got < 0 ? errno : EFAULT;
      gone = err == ESRCH || err == EFAULT || peers->state(members[static_cast<std::size_t>(src)]) == PeerTable::lost;
      return "process_vm_readv from rank " + std::to_string(members[static_cast<std::size_t>(src)]) + ": " +
             std::strerror(err) + (gone ? " (the sender is gone)" : " (set DOPT_SHM_CMA=0 to stage through shared memory)");
    }
    to += got;
    from += static_cast<std::uint64_t>(got);
    left -= static_cast<std::uint64_t>(got);
  }
  return "";
}

bool P2PEngine::State::step(Clock::time_point now) {
  bool busy = false;
  const int n = static_cast<int>(members.size());
  const bool i_failed = peers->state(members[static_cast<std::size_t>(me)]) != PeerTable::alive;
  if (peers->shutting_down()) {
    fail_all("the runtime shut down before the operation finished");
    return false;
  }
  // The peers' states, read before their headers and acks: a peer that
  // acked (or published) and then exited is lost only after what it wrote,
  // so what it wrote before is read below and counts (a receiver acks
  // before its recv completes, so it may exit at once).
  for (int g = 0; g < n; ++g)
    if (g != me) states[static_cast<std::size_t>(g)] = peers->state(members[static_cast<std::size_t>(g)]);
  for (int g = 0; g < n; ++g) {
    if (g == me) continue;
    const auto gi = static_cast<std::size_t>(g);
    // Publish what the window allows.
    while (!queued[gi].empty() && publish(g, queued[gi].front())) {
      Send s = std::move(queued[gi].front());
      queued[gi].pop_front();
      sent[gi].emplace(s.id, std::move(s));
      busy = true;
    }
    // Headers from g.
    void* src_base = bases[gi];
    while (true) {
      const std::uint64_t id = read_next[gi];
      const MailSlot* m = layout.mail_slot(src_base, me, id);
      if (m->id.load(std::memory_order_acquire) != id) break;
      Header h;
      h.id = id;
      h.tag = m->tag;
      h.seq = m->seq;
      h.dtype = static_cast<DType>(m->dtype);
      h.shape = shape_of(*m);
      h.hash = m->shape_hash;
      h.nbytes = m->nbytes;
      h.addr = m->addr;
      h.offset = m->offset;
      h.direct = m->direct != 0;
      h.segment.assign(m->segment, strnlen(m->segment, sizeof m->segment));
      unexpected[gi].push_back(std::move(h));
      read_next[gi] = id + 1;
      layout.read_line(bases[static_cast<std::size_t>(me)], g)->read_upto.store(id, std::memory_order_release);
      ring(doorbell(g), shared);
      busy = true;
    }
    // Acks from g for what this rank sent.
    for (auto it = sent[gi].begin(); it != sent[gi].end();) {
      const AckSlot* a = layout.ack_slot(src_base, me, it->first);
      if (a->id.load(std::memory_order_acquire) != it->first) {
        ++it;
        continue;
      }
      Send& s = it->second;
      if (!s.timed_out) {
        switch (static_cast<AckStatus>(a->status)) {
          case AckStatus::ok: s.op->promise.set_value(); break;
          case AckStatus::mismatch: fail(s.op, Failure{FailKind::mismatch, "send", std::string(a->why, strnlen(a->why, sizeof a->why))}); break;
          case AckStatus::cancelled: break;
          case AckStatus::receiver_failed:
            fail(s.op, Failure{FailKind::peer_lost, "send", std::string(a->why, strnlen(a->why, sizeof a->why))});
            break;
        }
      }
      if (s.heap_off != static_cast<std::size_t>(-1)) heap_release(s.heap_off, s.heap_len);
      it = sent[gi].erase(it);
      busy = true;
    }
  }
  // Match recvs (in post order) with the headers.
  for (auto it = recvs.begin(); it != recvs.end();) {
    const Op& op = *it->op;
    const int src = grank_of(op.peer);
    auto& hs = unexpected[static_cast<std::size_t>(src)];
    auto h = std::find_if(hs.begin(), hs.end(), [&](const Header& x) { return x.tag == op.tag && x.seq == op.seq; });
    if (h == hs.end()) {
      ++it;
      continue;
    }
    complete_recv(*it, src, *h);
    hs.erase(h);
    it = recvs.erase(it);
    busy = true;
  }
  // Withdrawn sends, and sends to a rank that failed, are refused.
  for (int g = 0; g < n; ++g) {
    if (g == me) continue;
    auto& hs = unexpected[static_cast<std::size_t>(g)];
    for (auto h = hs.begin(); h != hs.end();) {
      // A withdrawn message's slot may have been reused only after we read
      // it, so its flag is still the sender's word on it.
      const MailSlot* m = layout.mail_slot(bases[static_cast<std::size_t>(g)], me, h->id);
      const bool cancelled = m->id.load(std::memory_order_acquire) == h->id && m->cancelled.load(std::memory_order_acquire);
      if (cancelled || i_failed) {
        ack(g, h->id, cancelled ? AckStatus::cancelled : AckStatus::receiver_failed,
            "rank " + std::to_string(members[static_cast<std::size_t>(me)]) + " failed before receiving: " +
                peers->why(members[static_cast<std::size_t>(me)]));
        h = hs.erase(h);
        busy = true;
      } else {
        ++h;
      }
    }
  }
  // Lost peers and deadlines.
  auto lost_why = [&](int g) { return peers->why(members[static_cast<std::size_t>(g)]); };
  for (int g = 0; g < n; ++g) {
    if (g == me) continue;
    const auto gi = static_cast<std::size_t>(g);
    const auto st = states[gi];
    const std::string who = "rank " + std::to_string(members[gi]);
    auto send_fail = [&](Send& s) -> bool {  // true: drop it
      if (st == PeerTable::lost) {
        if (!s.timed_out) fail(s.op, Failure{FailKind::peer_lost, "send", who + " was lost before receiving: " + lost_why(g)});
        return true;
      }
      // A receiver whose user code failed posts no more recvs: what it has
      // not even read cannot be received.
      if (st == PeerTable::failed && !s.timed_out &&
          (s.id == 0 || layout.read_line(bases[gi], me)->read_upto.load(std::memory_order_acquire) < s.id)) {
        fail(s.op, Failure{FailKind::peer_lost, "send", who + " failed before receiving: " + lost_why(g)});
        s.timed_out = true;
        if (s.id) layout.mail_slot(bases[static_cast<std::size_t>(me)], g, s.id)->cancelled.store(1, std::memory_order_release);
        return s.id == 0;
      }
      if (!s.timed_out && now >= s.deadline) {
        fail(s.op, Failure{FailKind::timeout, "send",
                           "timed out after " + std::to_string(s.op->timeout.count()) + " ms: " + who +
                               " did not receive (tag " + std::to_string(s.op->tag) + ")"});
        s.timed_out = true;
        if (s.id) layout.mail_slot(bases[static_cast<std::size_t>(me)], g, s.id)->cancelled.store(1, std::memory_order_release);
        return s.id == 0;  // published ones wait for the receiver's ack (it may be reading the bytes)
      }
      return false;
    };
    for (auto it = queued[gi].begin(); it != queued[gi].end();) it = send_fail(*it) ? queued[gi].erase(it) : std::next(it);
    for (auto it = sent[gi].begin(); it != sent[gi].end();) {
      if (!send_fail(it->second)) {
        ++it;
        continue;
      }
      // Dropped only when the peer is lost: nobody reads the block any more.
      if (it->second.heap_off != static_cast<std::size_t>(-1)) heap_release(it->second.heap_off, it->second.heap_len);
      it = sent[gi].erase(it);
    }
  }
  for (auto it = recvs.begin(); it != recvs.end();) {
    const Op& op = *it->op;
    const int src = grank_of(op.peer);
    const auto st = states[static_cast<std::size_t>(src)];
    // Nothing matched it above: a failed or lost sender sends nothing more.
    if (st != PeerTable::alive) {
      fail(it->op, Failure{FailKind::peer_lost, "recv",
                           "rank " + std::to_string(op.peer) + " was lost before sending: " + lost_why(src)});
      it = recvs.erase(it);
    } else if (now >= it->deadline) {
      fail(it->op, Failure{FailKind::timeout, "recv",
                           "timed out after " + std::to_string(op.timeout.count()) + " ms: rank " +
                               std::to_string(op.peer) + " did not send (tag " + std::to_string(op.tag) + ")"});
      it = recvs.erase(it);
    } else {
      ++it;
    }
  }
  return busy;
}

}  // namespace dopt::detail::shm_plane
