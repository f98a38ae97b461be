// ProcessGroup::shrink: the surviving members of a group agree on a new group
// without the lost ones (contract in process_group.hpp, design in
// docs/fault-tolerance.md).
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <tuple>

#include "dopt/actors/process_group.hpp"
#include "collectives/access.hpp"
#include "collectives/group.hpp"
#include "collectives/meeting.hpp"
#include "sim/sync.hpp"

namespace dopt {
namespace {

using detail::GroupImpl;
using detail::PeerTable;
using detail::SimMeeting;
using detail::group_over;
using detail::ranks_str;
namespace sim = detail::sim;

std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Ids of shrunk groups have the top bit set (new_group's ids, (seq + 1) << 16
// plus a small index, never reach it); bit 62 tells the survivors' meeting
// (actor plane only) from the group itself.
constexpr std::uint64_t kShrunkBit = 1ull << 63;
constexpr std::uint64_t kMeetingBit = 1ull << 62;

/// The id of the group of `members` in the line that started with group
/// `origin`: the same on every survivor, whichever group of the line it
/// shrinks. A line only ever loses members, so it never names a group twice.
std::uint64_t shrunk_gid(std::uint64_t origin, const std::vector<int>& members) {
  std::uint64_t h = mix64(origin ^ 0x5368726bull);
  for (int r : members) h = mix64(h ^ static_cast<std::uint64_t>(r));
  h = mix64(h ^ members.size());
  return kShrunkBit | (h & ~(kShrunkBit | kMeetingBit));
}


}  // namespace

ShrinkResult ProcessGroup::shrink() {
  const char* op = "ProcessGroup.shrink";
  auto& g = member(op);
  if (!g.peers) throw NotSupportedError(op, "this group has no view of its members' liveness", rank());
  const std::uint64_t origin = g.origin ? *g.origin : g.gid;
  const std::vector<int>& old = *g.members;
  const int me = old[static_cast<std::size_t>(g.my_grank)];
  std::string why;
  // Each attempt leaves out at least one more member than the one before.
  for (std::size_t attempt = 0; attempt <= old.size(); ++attempt) {
    std::vector<int> alive;
    auto view = [&] {
      alive.clear();
      for (int r : old)
        if (r == me || g.peers->state(r) == PeerTable::alive) alive.push_back(r);
    };
    view();
    // A PeerLostError can come before this rank's own liveness verdict (a
    // host-mate aborted the hierarchical plane's channel): give the verdict
    // up to 3 s before refusing (virtual seconds in deterministic simulation,
    // where a real sleep would hold up every other rank).
    if (sim::active() && alive.size() == old.size()) {  // deterministic simulation: in virtual time
      sim::block([&] {
        for (int r : old)
          if (r != me && g.peers->state(r) != PeerTable::alive) return true;
        return false;
      }, sim::now() + std::chrono::seconds(3), "shrink: a lost member");
      view();
    }
    for (int i = 0; !sim::active() && i < 600 && alive.size() == old.size(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      view();
    }
    // Removed from the job (stopped for longer than the peer timeout, or
    // told so by a peer that had declared it lost): it must not go on.
    if (const std::string removed = g.peers->fenced(); !removed.empty())
      throw StateError(op, "this rank cannot go on: " + removed + "; it cannot rejoin", me);
    if (alive.size() == old.size())  // (so a line of groups never names one twice: it only loses members)
      throw StateError(op, "no member of " + ranks_str(old) + " was lost (this rank sees all of them alive)", me);
    // The majority rule (processes): members lost on silence only may be
    // running on the other side of a partition, and shrink there too.
    if (!g.peers->in_process()) {
      std::vector<int> suspected;
      for (int r : old)
        if (r != me && g.peers->state(r) != PeerTable::alive && g.peers->suspected(r)) suspected.push_back(r);
      if (!detail::may_go_on(alive, suspected)) {
        std::vector<int> both = alive;
        both.insert(both.end(), suspected.begin(), suspected.end());
        std::sort(both.begin(), both.end());
        throw StateError(op, "this rank is cut off: it sees " + ranks_str(alive) + " of " + ranks_str(old) +
                                 " alive and lost " + ranks_str(suspected) +
                                 " without knowing that their processes ended (silence, or seen just after this "
                                 "process had not run for longer than the peer timeout); they may be going on "
                                 "without it, and " + ranks_str(alive) +
                                 (alive.size() == suspected.size()
                                      ? " is half, without the lowest rank " + std::to_string(both.front())
                                      : std::string(" is the smaller side")) +
                                 ", so this rank stops (docs/fault-tolerance.md, \"Who goes on\")",
                         me);
      }
    }
    const int my_new = static_cast<int>(std::find(alive.begin(), alive.end(), me) - alive.begin());
    auto members = std::make_shared<const std::vector<int>>(alive);
    const std::uint64_t gid = shrunk_gid(origin, alive);
    // The meeting: barriers on the rank actors among the proposed members.
    ProcessGroup meeting(group_over(g, gid | kMeetingBit, members, my_new));
    try {
      std::optional<SimMeeting> sim_meeting;
      if (sim::active()) sim_meeting.emplace(*g.peers, gid | kMeetingBit, alive, me, "the survivors", "shrink meeting");
      const std::chrono::milliseconds timeout(g.timeout_ms.load());
      auto meet = [&](int step) {
        if (sim_meeting)
          sim_meeting->barrier(step, timeout, op);
        else
          meeting.barrier();
      };
      // Its first barrier: everybody proposed these members.
      auto ng = detail::build_group_part(g, gid, members, my_new, meet);
      if (sim_meeting) sim_meeting->leave();
      ng->origin = origin;
      ShrinkResult out;
      out.group = detail::Access::group(std::move(ng));
      for (std::size_t r = 0; r < old.size(); ++r) {
        auto it = std::find(alive.begin(), alive.end(), old[r]);
        out.new_rank.push_back(it == alive.end() ? -1 : static_cast<int>(it - alive.begin()));
        if (it == alive.end()) out.lost.push_back(static_cast<int>(r));
      }
      return out;
    } catch (const PeerLostError& e) {
      why = e.detail();  // a proposed member was lost meanwhile: propose again without it
    }
  }
  throw PeerLostError(op, "the survivors of " + ranks_str(old) + " could not agree on a group: " + why, me);
}

}  // namespace dopt
