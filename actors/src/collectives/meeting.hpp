#pragma once
// What ProcessGroup::shrink (shrink.cpp), ProcessGroup::grow (grow.cpp) and
// detail::subgroups_of (subgroups.cpp) share when they make a group: the new
// group's GroupImpl over an old one's runtime, its part on the plane between
// the members' barriers, and the members' meeting in deterministic simulation. Rank
// thread. Not installed.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/group.hpp"
#include "dopt/runtime/error.hpp"
#include "sim/sync.hpp"

namespace dopt::detail {

inline std::string ranks_str(const std::vector<int>& r) {
  std::string s = "[";
  for (std::size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s + "]";
}

/// A group `gid` of `members` (this rank at my_grank) on `from`'s runtime:
/// its endpoint, peers, timeout and local world size; no plane yet.
inline std::shared_ptr<GroupImpl> group_over(const GroupImpl& from, std::uint64_t gid,
                                      std::shared_ptr<const std::vector<int>> members, int my_grank) {
  auto g = std::make_shared<GroupImpl>();
  g->endpoint = from.endpoint;
  g->gid = gid;
  g->members = std::move(members);
  g->my_grank = my_grank;
  g->timeout_ms.store(from.timeout_ms.load());
  g->local_world_size = from.local_world_size;
  g->peers = from.peers;
  return g;
}

/// This rank's part of the group `gid` of `members` (at my_grank) on
/// `from`'s runtime and plane (shrink's, grow's and subgroups_of's new
/// groups), made between barriers of its members, meet(step): every member
/// knows the group (1); then, where the plane has a builder, every member
/// made its own state (2) and attached every member's (3), and seals. A
/// barrier that throws leaves the builder's state dropped.
template <class Meet>
std::shared_ptr<GroupImpl> build_group_part(const GroupImpl& from, std::uint64_t gid,
                                            std::shared_ptr<const std::vector<int>> members, int my_grank,
                                            const Meet& meet) {
  meet(1);
  std::shared_ptr<GroupPlane> plane;
  if (auto builder = from.plane ? from.plane->builder(gid, members) : nullptr) {
    builder->create();
    meet(2);
    plane = builder->attach();
    meet(3);
    builder->seal();
  }
  auto g = group_over(from, gid, std::move(members), my_grank);
  g->plane = std::move(plane);
  return g;
}

/// A meeting of the members of a group being made (shrink's survivors,
/// grow's members and newcomers) in deterministic simulation: every rank is
/// a task of this process, so they meet in its memory, waiting through the
/// scheduler (the rank actors' barriers run on CAF's threads, which it does
/// not drive). Same outcomes as barriers: every proposed member arrived, or
/// PeerLostError when one is lost first, or TimeoutError (virtual time).
/// `who` names the members in messages ("the survivors"), `label` the wait
/// in the scheduler's trace.
class SimMeeting {
 public:
  SimMeeting(const PeerTable& peers, std::uint64_t gid, std::vector<int> members, int me, const char* who,
             const char* label)
      : peers_(peers), key_{sim::run_id(), &peers, gid}, members_(std::move(members)), me_(me), who_(who),
        label_(label) {}

  void barrier(int step, std::chrono::milliseconds timeout, const char* op) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      table()[key_].arrived[me_] = step;
    }
    auto arrived = [&] {
      std::lock_guard<std::mutex> lock(mutex());
      auto& m = table()[key_];
      for (int r : members_)
        if (auto it = m.arrived.find(r); it == m.arrived.end() || it->second < step) return false;
      return true;
    };
    auto lost = [&] {
      for (int r : members_)
        if (r != me_ && peers_.state(r) != PeerTable::alive) return r;
      return -1;
    };
    sim::block([&] { return arrived() || lost() >= 0; }, sim::now() + timeout, label_);
    if (arrived()) return;
    if (const int r = lost(); r >= 0)
      throw PeerLostError(op, "rank " + std::to_string(r) + " was lost while " + who_ + " met", me_);
    throw TimeoutError(op, std::string(who_) + " " + ranks_str(members_) + " did not meet within " +
                               std::to_string(timeout.count()) + " ms", me_);
  }

 private:
  struct Entry {
    std::map<int, int> arrived;  // member -> the last step it reached
    std::size_t left = 0;
  };
  using Key = std::tuple<std::uint64_t, const void*, std::uint64_t>;
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<Key, Entry>& table() {
    static std::map<Key, Entry> t;
    return t;
  }

 public:
  /// After the last barrier: the last member to leave forgets the meeting.
  void leave() {
    std::lock_guard<std::mutex> lock(mutex());
    auto it = table().find(key_);
    if (it != table().end() && ++it->second.left == members_.size()) table().erase(it);
  }

  const PeerTable& peers_;
  Key key_;
  std::vector<int> members_;
  int me_;
  const char* who_;
  const char* label_;
};

}  // namespace dopt::detail
