#include "transport/shm/directory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <new>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/shm.hpp"
#include "transport/shm/board.hpp"
#include "transport/shm/region.hpp"

namespace dopt::detail::shm_plane {

namespace {

/// Writes a fresh control block at base.
void init_region(void* base, std::uint64_t gid, int global_rank, std::size_t bytes) {
  auto* cb = new (base) ControlBlock();
  cb->magic = kRegionMagic;
  cb->version = kRegionVersion;
  cb->gid = gid;
  cb->global_rank = static_cast<std::uint32_t>(global_rank);
  cb->pid = static_cast<std::int32_t>(::getpid());
  cb->bytes = bytes;
  cb->self_addr = reinterpret_cast<std::uint64_t>(base);
}

void check_region(void* base, std::uint64_t gid, const std::string& what) {
  const auto* cb = static_cast<const ControlBlock*>(base);
  if (cb->magic != kRegionMagic || cb->version != kRegionVersion || cb->gid != gid)
    throw StateError("shm", what + " is not a dopt region of group " + std::to_string(gid) +
                                " (another dopt version, or another job on this host?)");
}

}  // namespace

GroupRegions RegionDirectory::open_group(std::uint64_t gid, const std::vector<int>& members, int global_rank,
                                         const Mapped& mine, std::size_t bytes) {
  auto base = std::make_shared<std::vector<void*>>();
  auto keeps = std::make_shared<std::vector<std::shared_ptr<void>>>();
  for (int r : members) {
    Mapped x = r == global_rank ? mine : open(gid, r, bytes);
    base->push_back(x.base);
    keeps->push_back(x.keep);
  }
  return GroupRegions{std::move(base), std::move(keeps), nullptr};
}

Mapped LocalDirectory::create(std::uint64_t gid, int global_rank, std::size_t bytes, std::size_t) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw StateError("shm", "cannot allocate " + std::to_string(bytes) + " bytes for group " + std::to_string(gid) +
                                ": " + std::strerror(errno));
  init_region(p, gid, global_rank, bytes);
  Mapped m{p, std::shared_ptr<void>(p, [bytes](void* q) { ::munmap(q, bytes); })};
  std::lock_guard<std::mutex> lock(mutex_);
  regions_[{gid, global_rank}] = m;
  return m;
}

Mapped LocalDirectory::open(std::uint64_t gid, int global_rank, std::size_t) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find({gid, global_rank});
  if (it == regions_.end())
    throw StateError("shm", "rank " + std::to_string(global_rank) + " has no region of group " + std::to_string(gid));
  return it->second;
}

GroupRegions LocalDirectory::open_group(std::uint64_t gid, const std::vector<int>& members, int global_rank,
                                        const Mapped& mine, std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = groups_.find(gid);
    if (it != groups_.end() && it->second.base->size() == members.size()) return it->second;
  }
  GroupRegions g = RegionDirectory::open_group(gid, members, global_rank, mine, bytes);
  g.board = std::make_shared<Board>(static_cast<int>(members.size()));
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_.try_emplace(gid, std::move(g)).first->second;  // another member's, when it was first
}

void LocalDirectory::seal(std::uint64_t gid, int global_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  regions_.erase({gid, global_rank});
  const auto next = regions_.lower_bound({gid, std::numeric_limits<int>::min()});
  if (next == regions_.end() || next->first.first != gid) groups_.erase(gid);  // every member's region is sealed
}

ShmDirectory::ShmDirectory(std::vector<int> pids, std::string job) : pids_(std::move(pids)), job_(std::move(job)) {}

std::string ShmDirectory::name(std::uint64_t gid, int global_rank) const {
  int pid = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pid = pids_.at(static_cast<std::size_t>(global_rank));
  }
  return "/dopt-" + std::to_string(pid) + "-" + job_ + "-g" + std::to_string(gid);
}

void ShmDirectory::renew_process(int global_rank, int pid) {
  std::lock_guard<std::mutex> lock(mutex_);
  pids_.at(static_cast<std::size_t>(global_rank)) = pid;
}

Mapped ShmDirectory::create(std::uint64_t gid, int global_rank, std::size_t bytes, std::size_t reserve) {
  std::shared_ptr<shm::Segment> seg;
  try {
    seg = shm::Segment::create(name(gid, global_rank), bytes, reserve);
  } catch (const IOError& e) {
    throw IOError(e.op(), e.detail(), global_rank);  // the rank that hit it
  }
  init_region(seg->data(), gid, global_rank, bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    own_[gid] = seg;
  }
  return Mapped{seg->data(), seg};
}

Mapped ShmDirectory::open(std::uint64_t gid, int global_rank, std::size_t bytes) {
  const std::string n = name(gid, global_rank);
  auto seg = shm::Segment::open(n, bytes);
  check_region(seg->data(), gid, n);
  return Mapped{seg->data(), seg};
}

void ShmDirectory::seal(std::uint64_t gid, int) {
  std::shared_ptr<void> seg;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = own_.find(gid);
    if (it == own_.end()) return;
    seg = std::move(it->second);
    own_.erase(it);
  }
  static_cast<shm::Segment*>(seg.get())->unlink();
}

}  // namespace dopt::detail::shm_plane
