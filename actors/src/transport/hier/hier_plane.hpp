#pragma once
// The hierarchical plane of one rank: which host every rank is on, the
// shared-memory plane of this host's ranks, the TCP mesh, and the groups
// (world and subgroups) made on them.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plane/group_registry.hpp"
#include "dopt/runtime/internal/tcp_transport.hpp"
#include "plane/peer_table.hpp"
#include "dopt/actors/internal/group_plane.hpp"
#include "transport/hier/hier_group.hpp"
#include "transport/shm/shm_plane.hpp"

namespace dopt::detail::hier {

class HierPlane : public std::enable_shared_from_this<HierPlane> {
 public:
  /// host_ids: every global rank's host identity; local: the shared-memory
  /// plane over this host's ranks (its directory finds their regions).
  HierPlane(int global_rank, std::vector<std::string> host_ids, std::shared_ptr<shm_plane::ShmPlane> local,
            std::shared_ptr<transport::TcpMesh> mesh, std::shared_ptr<PeerTable> peers);

  int rank() const noexcept { return rank_; }
  /// Whether members (global ranks, ascending) make a hierarchical group:
  /// several hosts, the same number of members on each.
  bool spans_hosts_evenly(const std::vector<int>& members) const;
  bool all_here(const std::vector<int>& members) const;
  /// This rank's region of group gid over the members on this host (created
  /// before the group is announced).
  shm_plane::Mapped create_region(std::uint64_t gid, const std::vector<int>& members);
  /// The plane of group gid over members (this rank among them): the
  /// hierarchical one, or the shared-memory plane's when every member is on
  /// this host; null when the hosts hold different numbers of members (the
  /// group then runs on the actor plane). `mine` from create_region.
  std::shared_ptr<GroupPlane> attach(std::uint64_t gid, const std::vector<int>& members, const shm_plane::Mapped& mine);
  /// Every member on this host mapped this rank's region of gid: its name goes.
  void seal(std::uint64_t gid) { local_->directory().seal(gid, rank_); }
  /// A group that new_groups made and nobody took yet (the caller keeps it).
  std::shared_ptr<GroupPlane> take_group(std::uint64_t gid);
  /// The new_group call on the world group.
  void new_groups(HierGroup& world, HierCall& c);
  void shutdown(const std::string& why);

 private:
  std::vector<int> here(const std::vector<int>& members) const;

  int rank_;
  std::vector<std::string> host_ids_;
  std::shared_ptr<shm_plane::ShmPlane> local_;
  std::shared_ptr<transport::TcpMesh> mesh_;
  std::shared_ptr<PeerTable> peers_;
  GroupRegistry<HierGroup, GroupPlane> groups_;
};

}  // namespace dopt::detail::hier
