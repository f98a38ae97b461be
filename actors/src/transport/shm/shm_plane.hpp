#pragma once
// The shared-memory plane of one rank: its groups' channels and executors.
// Ranks on one host (processes through /dev/shm, or simulated ranks as
// threads) run every collective here without a message: see channel.hpp.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plane/group_registry.hpp"
#include "plane/executor.hpp"
#include "plane/peer_table.hpp"
#include "dopt/actors/internal/group_plane.hpp"
#include "transport/shm/channel.hpp"
#include "transport/shm/directory.hpp"
#include "transport/shm/p2p.hpp"

namespace dopt::detail::shm_plane {

class ShmPlane;

/// One rank's calls in one group.
class ShmGroup final : public GroupPlane {
 public:
  ShmGroup(std::shared_ptr<ShmPlane> plane, std::unique_ptr<Channel> channel);
  /// Calls submitted but not run yet fail (StateError), and the peers learn
  /// that this member will not run them (Channel::note_dropped).
  ~ShmGroup() override;
  void run(const OpPtr& op) override;
  Future<void> run_async(const OpPtr& op) override;
  bool supports(const CollDesc& desc) const override;
  const char* name() const noexcept override { return "shm"; }
  std::shared_ptr<GroupPlane> made_group(std::uint64_t gid) const override;
  /// A group of some of this group's members on this plane (new regions).
  std::unique_ptr<GroupBuilder> builder(std::uint64_t gid,
                                        std::shared_ptr<const std::vector<int>> members) const override;
  /// Later regions of global_rank are the replacement process pid's.
  bool renew_process(int global_rank, std::int64_t pid) override;
  /// Fails queued and later calls with StateError(why).
  void stop(const std::string& why);

 private:
  void execute(const Op& op);
  P2PEngine& p2p();
  std::shared_ptr<ShmPlane> plane_;  // the plane lives while any of its groups does
  std::unique_ptr<Channel> ch_;
  SerialExecutor exec_;
  std::mutex p2p_mutex_;
  std::unique_ptr<P2PEngine> p2p_;  // made on the first send or recv
  std::string stopped_;
};

class ShmPlane : public std::enable_shared_from_this<ShmPlane> {
 public:
  struct Options {
    /// Bytes of each of a region's two staging buffers (a round's chunk).
    std::size_t buf_bytes = 4u << 20;
    /// Calls with at most this much data per member take the small path.
    std::size_t small_bytes = 32u << 10;
    /// Threads of one process use the staged algorithms too (tests).
    bool staged_only = false;
    /// Processes: large all_gather reads peers' tensors with
    /// process_vm_readv (one copy) where every member can. Opt-in
    /// (DOPT_SHM_CMA=1) until it has been through the whole test suite.
    bool cma = false;
    /// Processes: a send is read by its receiver straight from the sender's
    /// tensor with process_vm_readv where the receiver can (p2p.hpp). On
    /// unless DOPT_SHM_CMA=0 or DOPT_SHM_STAGED=1.
    bool p2p_cma = true;
    /// Processes: where sends stage their bytes (sparse: only what is in
    /// flight takes memory). Larger messages use a named arena segment.
    std::size_t heap_bytes = 0;
    WaitPolicy policy;
    /// Defaults, overridden by DOPT_SHM_BUFFER_BYTES (at least 64 KiB),
    /// DOPT_SHM_SMALL_BYTES, DOPT_SHM_HEAP_BYTES, DOPT_SHM_STAGED=1 and
    /// DOPT_SHM_CMA=1.
    /// processes: ranks are processes (a send heap is needed).
    static Options from_env(int ranks_on_host, bool processes);
  };
  ShmPlane(int global_rank, std::shared_ptr<RegionDirectory> directory, std::shared_ptr<PeerTable> peers,
           Options options);

  int rank() const noexcept { return rank_; }
  RegionDirectory& directory() const noexcept { return *dir_; }
  const std::shared_ptr<PeerTable>& peers() const noexcept { return peers_; }

  /// This rank's region of group gid (of n members), made before the group is announced.
  Mapped create_region(std::uint64_t gid, int n);
  /// Maps the other members' regions of gid (they created theirs before
  /// announcing it) and makes the group's plane; `mine` from create_region.
  std::shared_ptr<ShmGroup> attach(std::uint64_t gid, std::shared_ptr<const std::vector<int>> members,
                                   const Mapped& mine);
  /// The channel over `members` (this rank among them) of group gid: maps the
  /// other members' regions (they created theirs before announcing it).
  std::unique_ptr<Channel> make_channel(std::uint64_t gid, std::shared_ptr<const std::vector<int>> members,
                                        const Mapped& mine);
  /// A group that new_groups made and nobody took yet (null when unknown);
  /// the caller keeps it.
  std::shared_ptr<ShmGroup> take_group(std::uint64_t gid);
  /// The new_group call (on the world group's channel): makes the groups it lists.
  void new_groups(Channel& world, Call& c);
  /// Every wait ends (StateError), every queued call fails. Idempotent.
  void shutdown(const std::string& why);

 private:
  int rank_;
  std::shared_ptr<RegionDirectory> dir_;
  std::shared_ptr<PeerTable> peers_;
  Options options_;
  GroupRegistry<ShmGroup> groups_;
};

}  // namespace dopt::detail::shm_plane
