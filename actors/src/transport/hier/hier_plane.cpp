#include "transport/hier/hier_plane.hpp"

#include <algorithm>

namespace dopt::detail::hier {

HierPlane::HierPlane(int global_rank, std::vector<std::string> host_ids, std::shared_ptr<shm_plane::ShmPlane> local,
                     std::shared_ptr<transport::TcpMesh> mesh, std::shared_ptr<PeerTable> peers)
    : rank_(global_rank),
      host_ids_(std::move(host_ids)),
      local_(std::move(local)),
      mesh_(std::move(mesh)),
      peers_(std::move(peers)) {}

std::vector<int> HierPlane::here(const std::vector<int>& members) const {
  std::vector<int> out;
  const std::string& mine = host_ids_[static_cast<std::size_t>(rank_)];
  for (int r : members)
    if (host_ids_[static_cast<std::size_t>(r)] == mine) out.push_back(r);
  return out;
}

bool HierPlane::all_here(const std::vector<int>& members) const { return here(members).size() == members.size(); }

bool HierPlane::spans_hosts_evenly(const std::vector<int>& members) const {
  std::map<std::string, int> count;
  for (int r : members) ++count[host_ids_[static_cast<std::size_t>(r)]];
  if (count.size() < 2) return false;
  for (const auto& [h, k] : count)
    if (k != count.begin()->second) return false;
  return true;
}

shm_plane::Mapped HierPlane::create_region(std::uint64_t gid, const std::vector<int>& members) {
  return local_->create_region(gid, static_cast<int>(here(members).size()));
}

std::shared_ptr<GroupPlane> HierPlane::attach(std::uint64_t gid, const std::vector<int>& members,
                                              const shm_plane::Mapped& mine) {
  const auto local_members = std::make_shared<const std::vector<int>>(here(members));
  if (all_here(members)) return local_->attach(gid, local_members, mine);
  if (!spans_hosts_evenly(members)) return nullptr;
  std::vector<std::string> ids;
  for (int r : members) ids.push_back(host_ids_[static_cast<std::size_t>(r)]);
  const int me = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  auto g = std::make_shared<HierGroup>(shared_from_this(), gid, Topology::make(members, ids, me),
                                       local_->make_channel(gid, local_members, mine), mesh_, peers_);
  groups_.add(gid, g);
  return g;
}

std::shared_ptr<GroupPlane> HierPlane::take_group(std::uint64_t gid) { return groups_.take(gid); }

void HierPlane::new_groups(HierGroup& world, HierCall& c) {
  const Op& op = *c.local.op;
  auto& ch = world.local();
  std::vector<std::pair<const GroupSpec*, shm_plane::Mapped>> mine;
  auto drop = [&] {
    for (auto& [spec, m] : mine) local_->directory().seal(spec->gid, rank_);
  };
  try {
    for (const auto& spec : op.creates)
      if (std::find(spec.members.begin(), spec.members.end(), rank_) != spec.members.end())
        mine.emplace_back(&spec, create_region(spec.gid, spec.members));
    // Every member announces the call once its regions exist; the members on
    // this host map each other's after the first round, and seal their own
    // after the second.
    const std::uint64_t k = ch.begin_round(c.local);
    ch.publish(k, op);
    ch.signal(shm_plane::Channel::A(k));
    ch.wait_all(shm_plane::Channel::A(k), c.local);
    world.match(k, c);
    for (auto& [spec, m] : mine) {
      if (auto g = attach(spec->gid, spec->members, m)) groups_.add_fresh(spec->gid, std::move(g));
    }
    ch.signal(shm_plane::Channel::B(k));
    ch.wait_all(shm_plane::Channel::B(k), c.local);
  } catch (...) {
    drop();
    throw;
  }
  drop();
}

void HierPlane::shutdown(const std::string& why) {
  groups_.shutdown(why, [&] { local_->shutdown(why); });
}

}  // namespace dopt::detail::hier
