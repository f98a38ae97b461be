#pragma once
// Where the members' regions of a group live. A member creates its own
// region before it announces a group (world set-up, new_group), maps its
// peers' regions once they announced theirs, and seals its own once every
// member mapped it (from then on nothing of the group has a name that a
// crash could leave behind).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dopt::detail::shm_plane {

struct Mapped {
  void* base = nullptr;
  std::shared_ptr<void> keep;  // the mapping lives while this does
};

class Board;

/// Every member's region of one group, as one member maps them.
struct GroupRegions {
  std::shared_ptr<const std::vector<void*>> base;  // index: group rank
  std::shared_ptr<void> keep;                      // keeps the mappings
  std::shared_ptr<Board> board;                    // threads of one process only (else null)
};

class RegionDirectory {
 public:
  virtual ~RegionDirectory() = default;
  /// This rank's new, zeroed region of group gid. Its first `reserve` bytes
  /// are backed at once (processes: allocated in /dev/shm, so that a full
  /// /dev/shm is an IOError naming it here, never a SIGBUS later); the rest
  /// may stay sparse.
  virtual Mapped create(std::uint64_t gid, int global_rank, std::size_t bytes, std::size_t reserve) = 0;
  /// Member global_rank's region of gid (it called create() before).
  virtual Mapped open(std::uint64_t gid, int global_rank, std::size_t bytes) = 0;
  /// Every member's region of gid (members: their global ranks, in group
  /// order; `mine`: the caller's own, from create()). Called by each member
  /// after every member created its region. This one opens each in turn.
  virtual GroupRegions open_group(std::uint64_t gid, const std::vector<int>& members, int global_rank,
                                  const Mapped& mine, std::size_t bytes);
  /// Every member mapped global_rank's region of gid: drop its name.
  virtual void seal(std::uint64_t gid, int global_rank) = 0;
  /// Rank global_rank runs in process `pid` from now on (a replacement):
  /// its regions of later groups are found there (this one names none by
  /// process: nothing to do).
  virtual void renew_process(int /*global_rank*/, int /*pid*/) {}
  /// Regions of other processes (futexes must be shared).
  virtual bool shared() const = 0;
  /// Members are threads of this process (their tensors are addressable).
  virtual bool in_process() const = 0;
};

/// Simulated ranks: regions are anonymous memory of this process, found by
/// (group, rank) in a table. The members of a group share one GroupRegions
/// (made by the first member that opens the group; with a Board), so that
/// n members cost O(n), not n x n, to attach and to hold.
class LocalDirectory final : public RegionDirectory {
 public:
  Mapped create(std::uint64_t gid, int global_rank, std::size_t bytes, std::size_t reserve) override;
  Mapped open(std::uint64_t gid, int global_rank, std::size_t bytes) override;
  GroupRegions open_group(std::uint64_t gid, const std::vector<int>& members, int global_rank, const Mapped& mine,
                          std::size_t bytes) override;
  void seal(std::uint64_t gid, int global_rank) override;
  bool shared() const override { return false; }
  bool in_process() const override { return true; }

 private:
  std::mutex mutex_;
  std::map<std::pair<std::uint64_t, int>, Mapped> regions_;
  std::map<std::uint64_t, GroupRegions> groups_;  // until every member's region of the group is sealed
};

/// Processes on one host: regions are /dev/shm segments named
/// "/dopt-<creator pid>-<job>-g<gid>".
class ShmDirectory final : public RegionDirectory {
 public:
  /// pids: every rank's process id (index: global rank); job: the same
  /// token on every rank, unique to this job on this host.
  ShmDirectory(std::vector<int> pids, std::string job);
  Mapped create(std::uint64_t gid, int global_rank, std::size_t bytes, std::size_t reserve) override;
  Mapped open(std::uint64_t gid, int global_rank, std::size_t bytes) override;
  void seal(std::uint64_t gid, int global_rank) override;
  void renew_process(int global_rank, int pid) override;
  bool shared() const override { return true; }
  bool in_process() const override { return false; }
  std::string name(std::uint64_t gid, int global_rank) const;

 private:
  std::vector<int> pids_;  // guarded by mutex_ (a replacement renews its rank's)
  std::string job_;
  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::shared_ptr<void>> own_;  // gid -> this rank's segment, until sealed
};

}  // namespace dopt::detail::shm_plane
