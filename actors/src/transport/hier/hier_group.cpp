#include "transport/hier/hier_group.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "dopt/actors/internal/call_label.hpp"
#include "plane/failure.hpp"
#include "transport/hier/hier_plane.hpp"

namespace dopt::detail::hier {

// --- Topology -------------------------------------------------------------------------

Topology Topology::make(std::vector<int> members, const std::vector<std::string>& host_ids, int me) {
  Topology t;
  t.members = std::move(members);
  t.me = me;
  const auto n = t.members.size();
  t.host_of.assign(n, -1);
  t.local_of.assign(n, -1);
  std::map<std::string, int> index;
  for (std::size_t g = 0; g < n; ++g) {
    const std::string& id = host_ids[g];
    auto it = index.find(id);
    if (it == index.end()) {
      it = index.emplace(id, static_cast<int>(t.hosts.size())).first;
      t.hosts.emplace_back();
    }
    t.host_of[g] = it->second;
    t.local_of[g] = static_cast<int>(t.hosts[static_cast<std::size_t>(it->second)].size());
    t.hosts[static_cast<std::size_t>(it->second)].push_back(static_cast<int>(g));
  }
  for (const auto& h : t.hosts)
    if (h.size() != t.hosts[0].size())
      throw StateError("hier", "the hosts hold different numbers of the group's members");
  return t;
}

// --- Transfers ------------------------------------------------------------------------

transport::Completion Transfers::track(std::shared_ptr<void> keep) {
  {
    std::lock_guard<std::mutex> lock(s_->m);
    ++s_->pending;
  }
  // The waiter is woken only when its wait can end (the last transfer, or
  // the first error), after the lock is released: a wake-up per transfer
  // costs a context switch each on a busy host.
  return [s = s_, keep = std::move(keep)](std::exception_ptr e) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(s->m);
      wake = (e && !s->error) || s->pending == 1;
      if (e && !s->error) s->error = e;
      --s->pending;
    }
    if (wake) s->cv.notify_all();
  };
}

void Transfers::send(int peer, transport::Tag tag, const void* data, std::size_t n, std::shared_ptr<void> keep) {
  mesh_.send(peer, tag, data, n, track(std::move(keep)));
}

void Transfers::recv(int peer, transport::Tag tag, void* data, std::size_t n, std::shared_ptr<void> keep) {
  mesh_.recv(peer, tag, data, n, track(std::move(keep)));
}

bool Transfers::pending() const {
  std::lock_guard<std::mutex> lock(s_->m);
  return s_->pending > 0;
}

void Transfers::wait(const std::function<void()>& check, bool drive) {
  // This thread runs the mesh's I/O itself where it can (no hand-off to the
  // I/O thread, no wake-up at the end); where another thread drives it, it
  // sleeps until woken, and tries again every 2 ms.
  State* s = s_.get();
  auto over = [s] { return s->pending == 0 || s->error != nullptr; };  // under s->m
  auto finished = [s, &over] {
    std::lock_guard<std::mutex> lock(s->m);
    return over();
  };
  for (;;) {
    if (finished() || (drive && mesh_.drive(finished, check) && finished())) break;
    std::unique_lock<std::mutex> lock(s->m);
    if (s->cv.wait_for(lock, std::chrono::milliseconds(2), over)) break;
    lock.unlock();
    check();  // throws to end the wait
  }
  std::lock_guard<std::mutex> lock(s_->m);
  if (s_->error) std::rethrow_exception(s_->error);
}

// --- HierGroup ------------------------------------------------------------------------

namespace {
/// The largest call (its tensors' bytes) whose waits drive the mesh (HierGroup::wait).
constexpr std::size_t k_drive_bytes = std::size_t(4) << 20;
}  // namespace

HierGroup::HierGroup(std::shared_ptr<HierPlane> plane, std::uint64_t gid, Topology topo,
                     std::unique_ptr<shm_plane::Channel> local, std::shared_ptr<transport::TcpMesh> mesh,
                     std::shared_ptr<PeerTable> peers)
    : plane_(std::move(plane)),
      gid_(gid),
      topo_(std::move(topo)),
      local_(std::move(local)),
      mesh_(std::move(mesh)),
      peers_(std::move(peers)),
      exec_([this](const Op& op) { execute(op); }, topo_.members[static_cast<std::size_t>(topo_.me)]) {}

HierGroup::~HierGroup() = default;

void HierGroup::run(const OpPtr& op) {
  local_->note_submitted(op->seq);
  exec_.run(op);
}

Future<void> HierGroup::run_async(const OpPtr& op) {
  local_->note_submitted(op->seq);
  return exec_.run_async(op);
}

bool HierGroup::supports(const CollDesc& desc) const {
  return desc.kind != CollKind::send && desc.kind != CollKind::recv;
}

std::shared_ptr<GroupPlane> HierGroup::made_group(std::uint64_t gid) const { return plane_->take_group(gid); }

std::shared_ptr<char[]> HierGroup::scratch(std::size_t n) {
  if (n > scratch_bytes_ || !scratch_) {
    scratch_bytes_ = std::max<std::size_t>(n, 64);
    scratch_ = std::shared_ptr<char[]>(new char[scratch_bytes_]);
  }
  return scratch_;
}

transport::Tag HierGroup::tag(const HierCall& c, Phase phase, std::uint64_t a, std::uint64_t b) const {
  return transport::Tag{c.op_id, (static_cast<std::uint64_t>(phase) << 56) | ((a & 0xFFFFFFFFULL) << 20) | (b & 0xFFFFF)};
}

void HierGroup::wait(Transfers& ts, HierCall& c, const std::vector<int>& waiting_for) {
  // A failed wait leaves its transfers behind (their buffers are the
  // group's regions, or kept alive by the transfers): the group is broken,
  // and the connections stay up for the other groups.
  const int me = global(topo_.me);
  auto lost_member = [&]() -> int {
    for (int q : peers_->order())
      if (q != me && std::find(topo_.members.begin(), topo_.members.end(), q) != topo_.members.end()) return q;
    return -1;
  };
  auto lost_error = [&](int q) {
    const std::string msg = "rank " + std::to_string(q) + " was lost during " + c.local.op->desc.str() + " in " +
                            group_str(gid_) + " (seq " + std::to_string(c.local.op->seq) + "): " + peers_->why(q);
    // This host's other members may wait on this one in the host's channel,
    // unaware of a loss on another host: they fail alike.
    local_->abort_group(msg, FailKind::peer_lost, c.local.op->seq);
    return PeerLostError(c.local.name, msg, me);
  };
  std::map<int, std::chrono::steady_clock::time_point> lost_since;
  std::optional<std::chrono::steady_clock::time_point> member_lost_since;
  try {
    ts.wait([&] {
      if (std::chrono::steady_clock::now() >= c.local.deadline) {
        std::string who;
        for (int p : waiting_for) who += " " + std::to_string(global(p));
        const Op& op = *c.local.op;
        const std::string msg = "timed out after " + std::to_string(op.timeout.count()) + " ms in " + op.desc.str() +
                                " (" + group_str(gid_) + ", seq " + std::to_string(op.seq) + "): rank(s)" + who +
                                " on other hosts did not answer";
        local_->abort_group(group_str(gid_) + " is unusable after a timeout on rank " + std::to_string(me) + ": " + msg,
                            FailKind::timeout, op.seq);
        throw TimeoutError(c.local.name, msg, me);
      }
      local_->check(c.local);
      // A peer that died closed its connection: the mesh ends its transfers
      // itself (with the bytes that had arrived, or an error). One that is
      // stopped or cut off keeps it open: give up on it once the control
      // plane declared it lost and the mesh still hears nothing.
      for (int p : waiting_for) {
        if (peers_->state(global(p)) == PeerTable::alive || mesh_->peer_lost(global(p))) continue;
        auto& since = lost_since[p];
        const auto now = std::chrono::steady_clock::now();
        if (since.time_since_epoch().count() == 0) since = now;
        if (now - since > std::chrono::milliseconds(500)) throw lost_error(lost_member() >= 0 ? lost_member() : global(p));
      }
      // Another member of the group lost (on another host than the peers
      // awaited): every call needs every member, and the awaited peer may be
      // a survivor that gave up on it already. So the survivors on every
      // host fail with PeerLostError (and can shrink the group) instead of
      // waiting for the timeout.
      if (peers_->generation() != 0) {
        if (const int q = lost_member(); q >= 0) {
          const auto now = std::chrono::steady_clock::now();
          if (!member_lost_since) member_lost_since = now;
          if (now - *member_lost_since > std::chrono::milliseconds(500)) throw lost_error(q);
        }
      }
    }, c.drives);
  } catch (const PeerLostError& e) {
    if (std::string(e.detail()).find(" was lost during ") != std::string::npos) throw;
    // The mesh lost a connection: name the member whose loss caused it (the
    // control plane tells within moments; the connection may only have been
    // closed by a survivor that gave up).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (lost_member() < 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (const int q = lost_member(); q >= 0) throw lost_error(q);
    local_->break_group(Failure{FailKind::peer_lost, "", e.detail()});
    throw;
  } catch (const TimeoutError& e) {
    local_->break_group(Failure{FailKind::timeout, "", e.detail()});
    throw;
  }
}

namespace {

/// What a member tells its cross peers about a call (fixed size).
struct Record {
  std::uint64_t seq = 0;
  std::uint64_t hash = 0;
  std::uint64_t buf_bytes = 0;  // the host's shared-memory buffers: the algorithms' messages depend on it
  std::uint32_t local_bad = 0;
  std::int32_t rank = 0;
  char desc[240] = {};
  char why[496] = {};
  char caller[64] = {};  // the public call that issued it (CollDesc::caller, cut), for the error
};

std::uint64_t hash_of(const CollDesc& d) {
  const std::string s = d.str() + "|" + d.extra + "|" + std::to_string(static_cast<int>(d.order)) + "|" +
                        std::to_string(d.pre_divisor);
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

void copy_str(char* dst, std::size_t cap, const std::string& s) {
  const std::size_t n = std::min(s.size(), cap - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

}  // namespace

namespace {

/// One call's exchange of records with its cross peers, and what its
/// verdict needs (copied: the verdict may come after the call gave up).
struct Match {
  Record mine;
  std::vector<Record> theirs;
  std::string local_bad;
  std::string name;   // the collective's name, for the error
  std::string desc;   // this rank's call (mine.desc may be cut short)
  std::uint64_t gid = 0;
  int host = 0;
  std::vector<std::vector<int>> host_ranks;  // global ranks on each host

  /// nullptr when every host called the same collective; else the error.
  std::exception_ptr verdict() const {
    const int me = mine.rank;
    if (!local_bad.empty()) return std::make_exception_ptr(CollectiveMismatchError(name, local_bad, me));
    for (std::size_t h = 0; h < theirs.size(); ++h) {
      if (static_cast<int>(h) == host) continue;
      const Record& r = theirs[h];
      if (r.local_bad)
        return std::make_exception_ptr(
            CollectiveMismatchError(name, std::string(r.why, strnlen(r.why, sizeof r.why)), me));
      if (r.buf_bytes != mine.buf_bytes)
        return std::make_exception_ptr(CollectiveMismatchError(
            name,
            "the hosts' shared-memory buffers differ in " + group_str(gid) + " at seq " + std::to_string(mine.seq) +
                ": " + std::to_string(mine.buf_bytes) + " bytes on rank " + std::to_string(me) + ", " +
                std::to_string(r.buf_bytes) + " on rank " + std::to_string(r.rank) +
                " (DOPT_SHM_BUFFER_BYTES must be the same on every host)",
            me));
    }
    // Every host's ranks agree among themselves: compare the hosts.
    for (std::size_t h = 0; h < theirs.size(); ++h) {
      if (static_cast<int>(h) == host) continue;
      const Record& r = theirs[h];
      if (r.seq != mine.seq || r.hash != mine.hash) {
        // No host reported a mismatch among its own ranks (local_bad), so
        // every rank called what its host's record says: name them all.
        std::vector<std::pair<int, std::string>> calls;
        for (std::size_t k = 0; k < host_ranks.size(); ++k) {
          const Record& on = static_cast<int>(k) == host ? mine : theirs[k];
          for (int g : host_ranks[k]) calls.emplace_back(g, std::string(on.caller, strnlen(on.caller, sizeof on.caller)));
        }
        std::sort(calls.begin(), calls.end());
        return std::make_exception_ptr(CollectiveMismatchError(
            name,
            mismatch_text(calls, "collective mismatch in " + group_str(gid) + " at seq " + std::to_string(mine.seq) +
                                     ": rank " + std::to_string(me) + " called " + desc + " but rank " +
                                     std::to_string(r.rank) + " called " +
                                     std::string(r.desc, strnlen(r.desc, sizeof r.desc)) +
                                     (r.seq != mine.seq ? " at seq " + std::to_string(r.seq) : std::string())),
            me));
      }
    }
    return nullptr;
  }
};

/// The transfers of a match left: the last one settles the verdict (every
/// completion runs on the mesh's I/O thread).
struct Pending {
  int left = 0;
  bool settled = false;
  transport::Completion verdict;
};

}  // namespace

void HierGroup::start_match(std::uint64_t round, HierCall& c, transport::Completion verdict) {
  const Op& op = *c.local.op;
  auto m = std::make_shared<Match>();
  m->local_bad = local_->mismatch(round, c.local);
  m->name = c.local.name;
  m->desc = op.desc.str();
  m->gid = gid_;
  m->host = topo_.host();
  m->host_ranks.resize(topo_.hosts.size());
  for (std::size_t h = 0; h < topo_.hosts.size(); ++h)
    for (int g : topo_.hosts[h]) m->host_ranks[h].push_back(global(g));
  Record& mine = m->mine;
  mine.seq = op.seq;
  mine.hash = hash_of(op.desc);
  mine.buf_bytes = local_->buf_bytes();
  mine.local_bad = m->local_bad.empty() ? 0 : 1;
  mine.rank = global(topo_.me);
  copy_str(mine.desc, sizeof mine.desc, m->desc);
  copy_str(mine.why, sizeof mine.why, m->local_bad);
  copy_str(mine.caller, sizeof mine.caller, op.desc.caller);
  const int H = topo_.num_hosts(), j = topo_.local();
  m->theirs.resize(static_cast<std::size_t>(H));
  auto pend = std::make_shared<Pending>();
  pend->left = 2 * (H - 1);
  pend->verdict = std::move(verdict);
  if (pend->left == 0) {
    mesh_->post([m, pend] { pend->verdict(m->verdict()); });
    return;
  }
  // The completions hold m: the records' buffers outlive a call that gave up.
  // The first failed transfer settles it (as a wait on them would end).
  auto settle = [m, pend](std::exception_ptr e) {
    --pend->left;
    if (pend->settled || (!e && pend->left > 0)) return;
    pend->settled = true;
    pend->verdict(e ? e : m->verdict());
  };
  for (int h = 0; h < H; ++h) {
    if (h == topo_.host()) continue;
    const int p = global(topo_.at(h, j));
    mesh_->recv(p, tag(c, kRecords, 0), &m->theirs[static_cast<std::size_t>(h)], sizeof(Record), settle);
    mesh_->send(p, tag(c, kRecords, 0), &m->mine, sizeof(Record), settle);
  }
}

void HierGroup::match(std::uint64_t round, HierCall& c) {
  Transfers ts(*mesh_);
  start_match(round, c, ts.expect());
  std::vector<int> peers;
  for (int h = 0; h < topo_.num_hosts(); ++h)
    if (h != topo_.host()) peers.push_back(topo_.at(h, topo_.local()));
  wait(ts, c, peers);
  c.matched = true;
}

std::uint64_t HierGroup::meet(HierCall& c, const std::vector<std::uint64_t>& entries) {
  const std::uint64_t k = local_->begin_round(c.local);
  if (!entries.empty()) std::memcpy(local_->buf(local_->me(), k), entries.data(), entries.size() * sizeof entries[0]);
  local_->publish(k, *c.local.op);
  local_->signal(Channel::A(k));
  local_->wait_all(Channel::A(k), c.local);
  match(k, c);
  return k;
}

std::vector<std::vector<std::uint64_t>> HierGroup::cross_memory_entries(std::uint64_t round, std::size_t count) {
  if (!local_->p2p_cma_ready()) return {};
  std::vector<std::vector<std::uint64_t>> all;
  for (int i = 0; i < local_->size(); ++i) {
    const auto* e = reinterpret_cast<const std::uint64_t*>(local_->buf(i, round));
    all.emplace_back(e, e + count);
    if (std::find(all.back().begin(), all.back().end(), 0) != all.back().end()) return {};
  }
  return all;
}

void HierGroup::execute(const Op& op) {
  HierCall c;
  c.local.op = &op;
  c.local.name = op.desc.who();
  local_->begin_call(c.local);
  c.op_id = (mesh_op_id(gid_, op.seq) ^ (std::uint64_t{1} << 62)) & ~(std::uint64_t{1} << 63);
  // Calls of up to k_drive_bytes drive the mesh while they wait: there the
  // hand-off to the I/O thread and the wake-up at the end weigh (2 hosts x
  // 2 ranks, 4 KiB: 464 -> 176 us); larger ones sleep, which measured the
  // same medians and without the occasional 190-210 ms call of a 64 MiB
  // all_reduce seen when driving (docs/performance.md, 2026-12-05).
  std::size_t bytes = 0;
  for (const auto& t : op.tensors) bytes += t.nbytes();
  c.drives = bytes <= k_drive_bytes;
  try {
    dispatch(c);
  } catch (const std::exception& e) {
    // An error in the middle of a call that the wait did not turn into the
    // group's end (a message of the wrong size, a failed read of a host
    // peer's memory): this host's members may wait on this one, or read its
    // tensors, in this call, and a later call's steps must not let them
    // through. So every member fails this call and the later ones alike.
    if (c.matched && !local_->broken()) {
      const int me = global(topo_.me);
      local_->abort_group(group_str(gid_) + " is unusable after an error on rank " + std::to_string(me) + " in " +
                              op.desc.str() + " (seq " + std::to_string(op.seq) + "): " + e.what(),
                          FailKind::state, op.seq);
    }
    throw;
  }
}

void HierGroup::dispatch(HierCall& c) {
  const Op& op = *c.local.op;
  switch (op.desc.kind) {
    case CollKind::all_reduce:
    case CollKind::all_reduce_coalesced:
    case CollKind::reduce:
    case CollKind::reduce_scatter: return all_reduce(*this, c);
    case CollKind::broadcast:
    case CollKind::broadcast_coalesced: return broadcast(*this, c);
    case CollKind::all_gather:
    case CollKind::all_gather_flat: return all_gather(*this, c);
    case CollKind::barrier: return barrier(*this, c);
    case CollKind::new_group: return plane_->new_groups(*this, c);
    case CollKind::send:
    case CollKind::recv: break;
  }
  throw StateError(c.local.name, "not a collective of the hierarchical plane", global(topo_.me));
}

}  // namespace dopt::detail::hier
