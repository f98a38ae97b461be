#include "transport/shm/directory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/shm.hpp"
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

void LocalDirectory::seal(std::uint64_t gid, int global_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  regions_.erase({gid, global_rank});
}

ShmDirectory::ShmDirectory(std::vector<int> pids, std::string job) : pids_(std::move(pids)), job_(std::move(job)) {}

std::string ShmDirectory::name(std::uint64_t gid, int global_rank) const {
  return "/dopt-" + std::to_string(pids_.at(static_cast<std::size_t>(global_rank))) + "-" + job_ + "-g" +
         std::to_string(gid);
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
