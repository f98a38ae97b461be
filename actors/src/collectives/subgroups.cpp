// detail::subgroups_of (dopt/actors/internal/subgroups.hpp): consecutive
// blocks of any group's ranks as groups of their own. On the world it is
// ProcessGroup::new_subgroups; on a group that shrink() or grow() made, each
// subgroup's members make it as shrink's survivors make theirs (meeting.hpp):
// they meet, then build its part on the group's plane between barriers.
#include "dopt/actors/internal/subgroups.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/access.hpp"
#include "collectives/group.hpp"
#include "collectives/meeting.hpp"
#include "sim/sync.hpp"

namespace dopt::detail {
namespace {

// Like shrunk and grown groups' ids: the top bit set (new_group's ids never
// reach it), bit 62 for the members' meeting.
constexpr std::uint64_t kTopBit = 1ull << 63;
constexpr std::uint64_t kMeetingBit = 1ull << 62;

/// The id of subgroup k (of size `size`) made by the call numbered `seq` on
/// group `parent` (FNV-1a): the same on every member.
std::uint64_t subgroup_gid(std::uint64_t parent, std::uint64_t seq, int size, int k) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ 0x53756267ull;
  auto eat = [&h](std::uint64_t v) {
    for (int byte = 0; byte < 8; ++byte) h = (h ^ ((v >> (8 * byte)) & 0xffu)) * 0x100000001b3ull;
  };
  eat(parent);
  eat(seq);
  eat(static_cast<std::uint64_t>(size));
  eat(static_cast<std::uint64_t>(k));
  return kTopBit | (h & ~(kTopBit | kMeetingBit));
}

/// This rank's subgroup `gid` of `members` (at my_new): the members meet,
/// then make its part on g's plane (create, meet, attach, meet, seal).
ProcessGroup make_mine(const GroupImpl& g, std::uint64_t gid, const std::shared_ptr<const std::vector<int>>& members,
                       int my_new, int me, const char* op) {
  const std::chrono::milliseconds timeout(g.timeout_ms.load());
  std::optional<SimMeeting> sim_meeting;
  ProcessGroup meeting;
  if (sim::active())
    sim_meeting.emplace(*g.peers, gid | kMeetingBit, *members, me, "the subgroup's members", "subgroups meeting");
  else
    meeting = Access::group(group_over(g, gid | kMeetingBit, members, my_new));
  auto meet = [&](int step) {
    if (sim_meeting)
      sim_meeting->barrier(step, timeout, op);
    else
      meeting.barrier();
  };
  auto ng = build_group_part(g, gid, members, my_new, meet);
  if (sim_meeting) sim_meeting->leave();
  return Access::group(std::move(ng));
}

}  // namespace

Subgroups subgroups_of(ProcessGroup& group, int group_size, const char* op) {
  const auto& impl = Access::impl(group);
  if (!impl || impl->my_grank < 0) throw StateError(op, "the group is invalid or does not hold this rank");
  GroupImpl& g = *impl;
  const int me = (*g.members)[static_cast<std::size_t>(g.my_grank)];
  const int n = group.size();
  if (group_size < 1 || n % group_size != 0)
    throw ValueError(op,
                     "a subgroup size must be positive and divide the group's size " + std::to_string(n) + ", got " +
                         std::to_string(group_size),
                     me);
  if (g.is_world) return group.new_subgroups(group_size);
  if (!g.peers) throw NotSupportedError(op, "this group has no view of its members' liveness", me);
  // Every member is at the same call of the group: its number names the subgroups.
  const std::uint64_t seq = g.next_seq.load();
  group.barrier();
  Subgroups out;
  for (int k = 0; k * group_size < n; ++k) {
    std::vector<int> ranks(g.members->begin() + k * group_size, g.members->begin() + (k + 1) * group_size);
    auto members = std::make_shared<const std::vector<int>>(std::move(ranks));
    const std::uint64_t gid = subgroup_gid(g.gid, seq, group_size, k);
    if (g.my_grank / group_size == k) {
      out.current = make_mine(g, gid, members, g.my_grank % group_size, me, op);
      out.all.push_back(out.current);
    } else {
      out.all.push_back(Access::group(group_over(g, gid, members, -1)));  // a handle with is_member() == false
    }
  }
  return out;
}

bool is_world_group(const ProcessGroup& group) {
  const auto& impl = Access::impl(group);
  return impl && impl->is_world;
}

}  // namespace dopt::detail
