// ProcessGroup::grow and ProcessGroup::join_group: the members of a group
// and newcomers agree on a new group of all of them (contract in
// process_group.hpp, design in docs/fault-tolerance.md, "Growing back").
// Between the ranks of a deterministic simulation: every rank is a task of
// this process, so members and newcomers meet in its memory (the lobby),
// waiting through the scheduler in virtual time.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "dopt/actors/process_group.hpp"
#include "collectives/access.hpp"
#include "collectives/group.hpp"
#include "collectives/grow.hpp"
#include "collectives/meeting.hpp"
#include "sim/sync.hpp"

namespace dopt {
namespace {

using detail::GroupImpl;
using detail::PeerTable;
namespace sim = detail::sim;

/// What the members' leader decided: the new group.
struct Admission {
  std::uint64_t gid = 0;
  std::shared_ptr<const std::vector<int>> members;
  /// The admitted newcomers, ascending.
  std::vector<int> joined;
};

struct Waiting {
  std::optional<Admission> admitted;
};

/// One run's lobby (guarded by lobby_mutex()).
struct Lobby {
  std::string job_id, secret;
  /// The newcomers waiting in join_group(), by global rank.
  std::map<int, Waiting> waiting;
  /// grow() calls so far of each (group id, member): the attempt number.
  std::map<std::pair<std::uint64_t, int>, int> calls;
  /// The leader's decision for each (group id, attempt).
  std::map<std::pair<std::uint64_t, int>, Admission> decided;
};

std::mutex& lobby_mutex() {
  static std::mutex m;
  return m;
}
std::map<const PeerTable*, Lobby>& lobbies() {
  static std::map<const PeerTable*, Lobby> all;
  return all;
}

std::string list_str(const std::vector<int>& r) {
  std::string s = "[";
  for (int x : r) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
  return s + "]";
}

/// The id of the grown group: from the group it grew from, the attempt and
/// the members (FNV-1a), top bit set like a shrunk group's.
std::uint64_t grown_gid(std::uint64_t from, int attempt, const std::vector<int>& members) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ 0x47726f77ull;
  auto eat = [&h](std::uint64_t v) {
    for (int byte = 0; byte < 8; ++byte) h = (h ^ ((v >> (8 * byte)) & 0xffu)) * 0x100000001b3ull;
  };
  eat(from);
  eat(static_cast<std::uint64_t>(attempt));
  for (int r : members) eat(static_cast<std::uint64_t>(r));
  eat(members.size());
  return (1ull << 63) | (h & ~(3ull << 62));
}

/// This run's lobby, or NotSupportedError naming op (the plane, or where grow works).
Lobby& lobby_of(const GroupImpl& g, const char* op, int me) {
  if (g.plane && std::string_view(g.plane->name()) == "mpi")
    throw NotSupportedError(op, "the MPI plane cannot grow a group: an MPI communicator's members are fixed when "
                                "MPI starts (run an elastic job on dopt's shm, TCP or hierarchical planes)", me);
  auto it = g.peers && sim::active() ? lobbies().find(g.peers.get()) : lobbies().end();
  if (it == lobbies().end()) {
    // Which plane this group runs on: processes that share memory ("shm"),
    // several hosts ("hier"), or messages between rank actors (TCP, threads).
    const std::string plane = g.plane ? g.plane->name() : "actor";
    throw NotSupportedError(op, "growing a group works between the ranks of a deterministic simulation "
                                "(simulate() with deterministic = true and newcomers) only; this group runs on the " +
                                plane + " plane" + (g.peers && !g.peers->in_process()
                                    ? ", between processes, where it is not implemented yet (docs/fault-tolerance.md, "
                                      "\"Between processes\")"
                                    : ", outside such a simulation"), me);
  }
  return it->second;
}

/// The first of `ranks` (other than me) that is not alive, or -1.
int first_lost(const PeerTable& peers, const std::vector<int>& ranks, int me) {
  for (int r : ranks)
    if (r != me && peers.state(r) != PeerTable::alive) return r;
  return -1;
}

/// Every member of the new group (old members and newcomers alike) makes
/// its part of the group on its plane between barriers of the meeting, as
/// shrink() does, and returns it.
ProcessGroup build(const GroupImpl& g, const Admission& a, int me, const char* op) {
  const std::vector<int>& members = *a.members;
  const std::chrono::milliseconds timeout(g.timeout_ms.load());
  detail::SimMeeting meeting(*g.peers, a.gid, members, me, "the members and newcomers", "grow meeting");
  auto meet = [&](int step) { meeting.barrier(step, timeout, op); };
  // The plane's part as shrink() makes it: every member knows the group (1),
  // made its own state (2), attached every member's (3); then sealed.
  std::shared_ptr<detail::GroupPlane> plane;
  auto builder = g.plane ? g.plane->builder(a.gid, a.members) : nullptr;
  meet(1);
  if (builder) builder->create(), meet(2), plane = builder->attach(), meet(3), builder->seal();
  meeting.leave();
  auto ng = detail::group_over(g, a.gid, a.members,
                               static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin()));
  ng->plane = std::move(plane);
  return detail::Access::group(std::move(ng));
}

}  // namespace

GrowResult ProcessGroup::grow(const GrowOptions& options) {
  const char* op = "ProcessGroup.grow";
  if (impl_ && impl_->my_grank < 0)
    throw StateError(op, "this rank is not a member of group " + std::to_string(impl_->gid) +
                             "; a newcomer calls join_group()", impl_->endpoint ? impl_->endpoint->rank() : -1);
  auto& g = member(op);
  const std::vector<int>& old = *g.members;
  const int me = old[static_cast<std::size_t>(g.my_grank)];
  if (options.newcomers < 1)
    throw ValueError(op, "newcomers must be >= 1, got " + std::to_string(options.newcomers), me);
  Lobby* lobby = nullptr;
  int attempt = 0;
  {
    std::lock_guard<std::mutex> lock(lobby_mutex());
    lobby = &lobby_of(g, op, me);
    attempt = lobby->calls[{g.gid, me}]++;
  }
  const std::pair<std::uint64_t, int> key{g.gid, attempt};
  const std::chrono::milliseconds timeout(g.timeout_ms.load());
  const auto deadline = sim::now() + timeout;
  const auto n = static_cast<std::size_t>(options.newcomers);
  // The candidates: waiting, alive, not admitted by another group.
  auto candidates = [&] {
    std::vector<int> c;
    for (const auto& [r, w] : lobby->waiting)
      if (!w.admitted && g.peers->state(r) == PeerTable::alive) c.push_back(r);
    return c;
  };
  auto decided = [&] {
    std::lock_guard<std::mutex> lock(lobby_mutex());
    return lobby->decided.count(key) > 0;
  };
  if (me == old.front()) {  // the leader admits the newcomers
    auto enough = [&] {
      std::lock_guard<std::mutex> lock(lobby_mutex());
      return candidates().size() >= n;
    };
    sim::block([&] { return enough() || first_lost(*g.peers, old, me) >= 0; }, deadline, "grow: newcomers");
    std::lock_guard<std::mutex> lock(lobby_mutex());
    std::vector<int> chosen = candidates();
    if (chosen.size() >= n) {
      chosen.resize(n);
      std::vector<int> members = old;
      members.insert(members.end(), chosen.begin(), chosen.end());
      std::sort(members.begin(), members.end());
      Admission a{grown_gid(g.gid, attempt, members), std::make_shared<const std::vector<int>>(members), chosen};
      for (int r : chosen) lobby->waiting[r].admitted = a;
      lobby->decided[key] = a;
    }
  } else {
    sim::block([&] { return decided() || first_lost(*g.peers, old, me) >= 0; }, deadline, "grow: the leader");
  }
  if (!decided()) {
    if (const int r = first_lost(*g.peers, old, me); r >= 0)
      throw PeerLostError(op, "member " + std::to_string(r) + " of " + list_str(old) +
                                  " was lost before the group grew; shrink() and grow() again", me);
    std::lock_guard<std::mutex> lock(lobby_mutex());
    throw TimeoutError(op, std::to_string(n) + " newcomer(s) expected, " + std::to_string(candidates().size()) +
                               " came within " + std::to_string(timeout.count()) + " ms", me);
  }
  Admission a;
  {
    std::lock_guard<std::mutex> lock(lobby_mutex());
    a = lobby->decided[key];
  }
  GrowResult out;
  out.group = build(g, a, me, op);
  for (int r : old)
    out.new_rank.push_back(static_cast<int>(std::find(a.members->begin(), a.members->end(), r) - a.members->begin()));
  out.joined = a.joined;
  return out;
}

GrowResult ProcessGroup::join_group(const JoinGroupOptions& options) {
  const char* op = "ProcessGroup.join_group";
  if (!impl_) throw StateError(op, "the process group is invalid (default-constructed)");
  auto& g = *impl_;
  const int me = g.endpoint ? g.endpoint->rank() : -1;
  if (g.my_grank >= 0)
    throw StateError(op, "this rank is already a member of group " + std::to_string(g.gid) +
                             "; its members call grow()", me);
  Lobby* lobby = nullptr;
  {
    std::lock_guard<std::mutex> lock(lobby_mutex());
    lobby = &lobby_of(g, op, me);
    if (options.job_id != lobby->job_id)
      throw AuthenticationError(op, "the members refused rank " + std::to_string(me) + ": job id '" +
                                        options.job_id + "' is not this job's", me);
    if (options.secret != lobby->secret)
      throw AuthenticationError(op, "the members refused rank " + std::to_string(me) +
                                        ": its secret is not the job's", me);
    lobby->waiting[me] = Waiting{};
  }
  const std::chrono::milliseconds timeout(g.timeout_ms.load());
  for (;;) {
    auto admitted = [&] {
      std::lock_guard<std::mutex> lock(lobby_mutex());
      return lobby->waiting[me].admitted.has_value();
    };
    sim::block(admitted, sim::now() + timeout, "join_group: admission");
    Admission a;
    {
      std::lock_guard<std::mutex> lock(lobby_mutex());
      auto& w = lobby->waiting[me];
      if (!w.admitted) {
        lobby->waiting.erase(me);
        throw TimeoutError(op, "no member grew a group within " + std::to_string(timeout.count()) +
                                   " ms; rank " + std::to_string(me) + " was not admitted", me);
      }
      a = *w.admitted;
    }
    try {
      GrowResult out;
      out.group = build(g, a, me, op);
      out.joined = a.joined;
      std::lock_guard<std::mutex> lock(lobby_mutex());
      lobby->waiting.erase(me);
      return out;
    } catch (const PeerLostError&) {
      // A member or another newcomer was lost while they met: wait for the
      // next grow() (the survivors shrink first, or the members try again).
      std::lock_guard<std::mutex> lock(lobby_mutex());
      lobby->waiting[me].admitted.reset();
    }
  }
}

}  // namespace dopt

namespace dopt::detail {

void open_grow_lobby(const PeerTable* peers, std::string job_id, std::string secret) {
  std::lock_guard<std::mutex> lock(lobby_mutex());
  auto& l = lobbies()[peers];
  l = Lobby{};
  l.job_id = std::move(job_id);
  l.secret = std::move(secret);
}

void close_grow_lobby(const PeerTable* peers) {
  std::lock_guard<std::mutex> lock(lobby_mutex());
  lobbies().erase(peers);
}

}  // namespace dopt::detail
