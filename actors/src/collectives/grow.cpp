// ProcessGroup::grow and ProcessGroup::join_group: the members of a group
// and newcomers agree on a new group of all of them (contract in
// process_group.hpp, design in docs/growing-back.md).
// Between the ranks of a deterministic simulation: every rank is a task of
// this process, so members and newcomers meet in its memory (the lobby),
// waiting through the scheduler in virtual time. Between processes on the
// actor plane or the shared-memory plane: the newcomers are replacements of
// lost ranks that joined the job (core/replacement.cpp); the members' leader
// admits them, tells the members in a broadcast over the old group and each
// newcomer through its rank actor, and they meet on rank-actor barriers as
// shrink's survivors do (on the shm plane, making the new group's regions
// between them).
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include <unistd.h>

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
  /// Between processes: the plane the members build the group on ("shm"),
  /// or "-" for none (the actor plane), so that a newcomer builds alike.
  std::string plane = "-";
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
    throw NotSupportedError(op, "growing a group works between processes (a replacement started by dopt-run "
                                "--on-failure replace) and between the ranks of a deterministic simulation "
                                "(simulate() with deterministic = true and newcomers); this group's ranks are "
                                "threads of one process outside such a simulation, on the " + plane + " plane", me);
  }
  return it->second;
}

/// The first of `ranks` (other than me) that is not alive, or -1.
int first_lost(const PeerTable& peers, const std::vector<int>& ranks, int me) {
  for (int r : ranks)
    if (r != me && peers.state(r) != PeerTable::alive) return r;
  return -1;
}

// --- between processes, on the actor and shm planes ------------------------------------

/// Whether `g`'s ranks are processes (outside a deterministic simulation):
/// the rank actors carry the admission and the meetings.
bool between_processes(const GroupImpl& g) { return g.peers && !g.peers->in_process() && !sim::active(); }

/// Between processes, a group grows on the actor plane (no data plane of its
/// own) and on the shared-memory plane; NotSupportedError naming op and the
/// plane otherwise (before anybody waits for a newcomer).
void check_plane_grows(const GroupImpl& g, const char* op, int me) {
  if (!g.plane || std::string_view(g.plane->name()) == "shm") return;
  const std::string plane = g.plane->name();
  throw NotSupportedError(op, "growing a group between processes works on the shm plane (every rank on one host) "
                              "and on the actor plane (DOPT_TRANSPORT=tcp); this group runs on the " + plane +
                              " plane" + (plane == "hier" ? ", where it is not implemented yet (a group that "
                                                            "shrink() made there runs on the actor plane and grows; "
                                                            "or start every rank with DOPT_TRANSPORT=tcp)"
                                                          : plane == "mpi" ? ": an MPI communicator's members are "
                                                                             "fixed when MPI starts" : "") +
                              " (docs/growing-back-processes.md, \"Between processes\")", me);
}

/// How this process's rank actor is reached (installed by init_process_group).
detail::AdmissionPost& post_of(const GroupImpl& g, const char* op, int me) {
  auto& post = detail::admission_post();
  if (!g.endpoint || !post.send.load() || !post.wait.load() || !post.revive.load())
    throw StateError(op, "this group's runtime has no rank actor to carry an admission", me);
  return post;
}

/// The newcomers the members of `old` may take: replacements of lost ranks
/// waiting at this process (PeerTable::announce), not members already.
std::vector<int> replacements_waiting(const PeerTable& peers, const std::vector<int>& old) {
  std::vector<int> c;
  for (int r = 0; r < peers.world_size(); ++r)
    if (peers.waiting(r) > 0 && peers.state(r) != PeerTable::alive &&
        std::find(old.begin(), old.end(), r) == old.end())
      c.push_back(r);
  return c;
}

/// An admission as the rank actors carry it: "GID M,M,... J,J,... PLANE".
std::string encode(const Admission& a) {
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int r : v) s += (s.empty() ? "" : ",") + std::to_string(r);
    return s;
  };
  return std::to_string(a.gid) + " " + list(*a.members) + " " + list(a.joined) + " " + a.plane;
}
Admission decode(const std::string& text) {
  std::istringstream in(text);
  std::string members, joined;
  Admission a;
  in >> a.gid >> members >> joined >> a.plane;
  auto list = [](const std::string& s) {
    std::vector<int> v;
    std::istringstream items(s);
    for (std::string x; std::getline(items, x, ',');) v.push_back(std::stoi(x));
    return v;
  };
  a.members = std::make_shared<const std::vector<int>>(list(members));
  a.joined = list(joined);
  return a;
}

/// The new group between processes, on plane `on` (the members' group's,
/// the admission says which): every member (old and new) meets on the rank
/// actors among the new members (as shrink's survivors). Without a plane one
/// barrier, and the group runs on the actor plane. On the shm plane the
/// first meeting also tells every member the others' process ids
/// (a newcomer's is new; the regions are named by them), then each makes its
/// part of the group between barriers as shrink() does: create, meet,
/// attach, meet, seal (a failed attempt drops its own region).
ProcessGroup build_between_processes(const GroupImpl& g, const std::shared_ptr<detail::GroupPlane>& on,
                                     const Admission& a, int me, const char* op) {
  const std::vector<int>& members = *a.members;
  const int my_new = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  ProcessGroup meeting = detail::Access::group(detail::group_over(g, a.gid | (1ull << 62), a.members, my_new));
  if (!on) {
    meeting.barrier();
    return detail::Access::group(detail::group_over(g, a.gid, a.members, my_new));
  }
  std::vector<std::int64_t> pids(static_cast<std::size_t>(g.peers->world_size()), 0);
  pids[static_cast<std::size_t>(me)] = static_cast<std::int64_t>(::getpid());
  Tensor t = Tensor::from_vector(pids);
  meeting.all_reduce(t);  // every member knows the group and every member's process
  pids = t.to_vector<std::int64_t>();
  for (int r : members)
    if (r != me && !on->renew_process(r, pids[static_cast<std::size_t>(r)]))
      throw NotSupportedError(op, "the " + std::string(on->name()) + " plane cannot take rank " +
                                      std::to_string(r) + "'s new process", me);
  auto builder = on->builder(a.gid, a.members);
  std::shared_ptr<detail::GroupPlane> plane;
  if (builder) builder->create(), meeting.barrier(), plane = builder->attach(), meeting.barrier(), builder->seal();
  auto ng = detail::group_over(g, a.gid, a.members, my_new);
  ng->plane = std::move(plane);
  return detail::Access::group(std::move(ng));
}

/// The members' side of grow() between processes (see the top of this file).
/// The leader waits for the newcomers until 3/4 of the group's timeout, so
/// the others' broadcast does not time out first.
GrowResult grow_between_processes(ProcessGroup& group, const GroupImpl& g, int me, std::size_t n, const char* op) {
  const std::vector<int>& old = *g.members;
  const std::chrono::milliseconds timeout(g.timeout_ms.load());
  static std::map<std::pair<const PeerTable*, std::uint64_t>, int> calls;  // guarded by lobby_mutex()
  int attempt = 0;
  {
    std::lock_guard<std::mutex> lock(lobby_mutex());
    attempt = calls[{g.peers.get(), g.gid}]++;
  }
  const auto world = static_cast<std::size_t>(g.peers->world_size());
  std::vector<std::int64_t> decision(2 + world, -1);  // [count, attempt, newcomers...]
  decision[0] = 0;
  decision[1] = attempt;
  if (me == old.front()) {
    const auto until = std::chrono::steady_clock::now() + timeout * 3 / 4;
    std::vector<int> chosen = replacements_waiting(*g.peers, old);
    while (chosen.size() < n && first_lost(*g.peers, old, me) < 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      chosen = replacements_waiting(*g.peers, old);
    }
    if (chosen.size() >= n) {
      decision[0] = static_cast<std::int64_t>(n);
      for (std::size_t i = 0; i < n; ++i) decision[2 + i] = chosen[i];
    }
  }
  Tensor t = Tensor::from_vector(decision);
  group.broadcast(t, 0);  // the members agree on the leader's decision (PeerLostError when one is lost)
  decision = t.to_vector<std::int64_t>();
  if (decision[0] <= 0)
    throw TimeoutError(op, std::to_string(n) + " newcomer(s) expected, " +
                               std::to_string(replacements_waiting(*g.peers, old).size()) + " came within " +
                               std::to_string((timeout * 3 / 4).count()) + " ms (a newcomer between processes is "
                               "the replacement of a lost rank: dopt-run --on-failure replace)", me);
  Admission a;
  std::vector<int> members = old;
  for (std::int64_t i = 0; i < decision[0]; ++i) {
    a.joined.push_back(static_cast<int>(decision[2 + static_cast<std::size_t>(i)]));
    members.push_back(a.joined.back());
  }
  std::sort(members.begin(), members.end());
  a.gid = grown_gid(g.gid, static_cast<int>(decision[1]), members);
  a.members = std::make_shared<const std::vector<int>>(std::move(members));
  if (g.plane) a.plane = g.plane->name();
  // Every member revives the newcomers' slots (alive again, the new
  // process's handle) before the meeting; until now a shrink() saw them lost.
  for (int r : a.joined)
    if (const std::string why = post_of(g, op, me).revive.load()(*g.endpoint, r, timeout); !why.empty())
      throw PeerLostError(op, "newcomer " + std::to_string(r) + " could not be taken: " + why, me);
  if (me == old.front())
    for (int r : a.joined) post_of(g, op, me).send.load()(*g.endpoint, r, encode(a));
  GrowResult out;
  out.group = build_between_processes(g, g.plane, a, me, op);
  for (int r : old)
    out.new_rank.push_back(static_cast<int>(std::find(a.members->begin(), a.members->end(), r) - a.members->begin()));
  out.joined = a.joined;
  return out;
}

/// A newcomer's join_group() between processes: it was admitted to the job
/// at rank 0's rendezvous already (the job's id and secret); it waits for
/// grow()'s leader to name its group, within the handle's timeout.
GrowResult join_between_processes(const GroupImpl& g, int me, const char* op) {
  const std::chrono::milliseconds timeout(g.timeout_ms.load());
  const std::string text = post_of(g, op, me).wait.load()(*g.endpoint, timeout, me);
  if (text.empty())
    throw TimeoutError(op, "no member grew a group within " + std::to_string(timeout.count()) + " ms; rank " +
                               std::to_string(me) + " was not admitted", me);
  const Admission a = decode(text);
  const std::string mine = g.plane ? g.plane->name() : "actor";
  if (a.plane != "-" && a.plane != mine)
    throw NotSupportedError(op, "the members grow their group on the " + a.plane + " plane and rank " +
                                    std::to_string(me) + " runs on the " + mine + " plane", me);
  GrowResult out;
  out.group = build_between_processes(g, a.plane == "-" ? nullptr : g.plane, a, me, op);
  out.joined = a.joined;
  return out;
}

/// Every member of the new group (old members and newcomers alike) makes
/// its part of the group on its plane between barriers of the meeting, as
/// shrink() does, and returns it.
ProcessGroup build(const GroupImpl& g, const Admission& a, int me, const char* op) {
  const std::vector<int>& members = *a.members;
  const std::chrono::milliseconds timeout(g.timeout_ms.load());
  detail::SimMeeting meeting(*g.peers, a.gid, members, me, "the members and newcomers", "grow meeting");
  auto meet = [&](int step) { meeting.barrier(step, timeout, op); };
  // The plane's part as shrink() makes it.
  auto ng = detail::build_group_part(
      g, a.gid, a.members, static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin()), meet);
  meeting.leave();
  return detail::Access::group(std::move(ng));
}

/// StateError naming op on a newcomer's handle (not a member of its group):
/// grow() and newcomers_waiting() are the members' calls.
void refuse_newcomer(const GroupImpl* g, const char* op) {
  if (g && g->my_grank < 0)
    throw StateError(op, "this rank is not a member of group " + std::to_string(g->gid) +
                             "; a newcomer calls join_group()", g->endpoint ? g->endpoint->rank() : -1);
}

}  // namespace

GrowResult ProcessGroup::grow(const GrowOptions& options) {
  const char* op = "ProcessGroup.grow";
  refuse_newcomer(impl_.get(), op);
  auto& g = member(op);
  const std::vector<int>& old = *g.members;
  const int me = old[static_cast<std::size_t>(g.my_grank)];
  if (options.newcomers < 1)
    throw ValueError(op, "newcomers must be >= 1, got " + std::to_string(options.newcomers), me);
  if (between_processes(g)) {
    check_plane_grows(g, op, me);
    // Rank 0 admits one newcomer at a time (a newcomer learns the members
    // when it is admitted, core/world.cpp): more would never come together.
    if (options.newcomers > 1)
      throw NotSupportedError(op, "newcomers = " + std::to_string(options.newcomers) +
                                      ": between processes newcomers join one at a time (rank 0 admits the next "
                                      "once the one waiting was taken in); grow({.newcomers = 1}) again while "
                                      "newcomers_waiting() > 0",
                              me);
    return grow_between_processes(*this, g, me, static_cast<std::size_t>(options.newcomers), op);
  }
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

int ProcessGroup::newcomers_waiting() {
  const char* op = "ProcessGroup.newcomers_waiting";
  refuse_newcomer(impl_.get(), op);
  auto& g = member(op);
  const std::vector<int>& old = *g.members;
  const int me = old[static_cast<std::size_t>(g.my_grank)];
  std::int64_t count = 0;
  if (between_processes(g)) {
    check_plane_grows(g, op, me);
    if (me == old.front()) count = static_cast<std::int64_t>(replacements_waiting(*g.peers, old).size());
  } else {
    std::lock_guard<std::mutex> lock(lobby_mutex());
    Lobby& lobby = lobby_of(g, op, me);  // NotSupportedError where grow() is
    if (me == old.front())
      for (const auto& [r, w] : lobby.waiting)
        if (!w.admitted && g.peers->state(r) == PeerTable::alive) ++count;
  }
  Tensor t = Tensor::from_vector(std::vector<std::int64_t>{count});
  broadcast(t, 0);  // the lowest member's view, on every member
  return static_cast<int>(t.to_vector<std::int64_t>()[0]);
}

GrowResult ProcessGroup::join_group(const JoinGroupOptions& options) {
  const char* op = "ProcessGroup.join_group";
  if (!impl_) throw StateError(op, "the process group is invalid (default-constructed)");
  auto& g = *impl_;
  const int me = g.endpoint ? g.endpoint->rank() : -1;
  if (g.my_grank >= 0)
    throw StateError(op, "this rank is already a member of group " + std::to_string(g.gid) +
                             "; its members call grow()", me);
  if (between_processes(g)) {
    check_plane_grows(g, op, me);
    return join_between_processes(g, me, op);
  }
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

AdmissionPost& admission_post() {
  static AdmissionPost post;
  return post;
}

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
