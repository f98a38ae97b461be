#include "dopt/runtime/internal/shm.hpp"
#include "dopt/runtime/settings.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "dopt/runtime/error.hpp"

namespace dopt::shm {

namespace {

std::string errno_str(int e) { return errno_text(e); }

void* map_fd(int fd, std::size_t bytes, const std::string& name, const char* op) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    throw IOError(op, "cannot map shared memory segment " + name + " (" + std::to_string(bytes) +
                          " bytes): " + errno_str(e));
  }
  return p;
}

constexpr std::size_t kMinClass = 4096;             // smallest block
constexpr std::size_t kSlabBytes = std::size_t{1} << 20;  // classes below this share 1 MiB segments

std::size_t class_of(std::size_t bytes) {
  std::size_t c = kMinClass;
  while (c < bytes) c <<= 1;
  return c;
}

}  // namespace

std::string dev_shm_short_text(const std::string& name, std::size_t need, int e) {
  std::string free_text = "an unknown number of";
  struct statvfs vfs {};
  if (::statvfs("/dev/shm", &vfs) == 0)
    free_text = "only " + std::to_string(static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize);
  return "cannot reserve " + std::to_string(need) + " bytes of /dev/shm for " + name + ": " + free_text +
         " bytes are free there (" + errno_str(e) +
         "). Give /dev/shm more room (Docker: --shm-size; as root: mount -o remount,size=... /dev/shm), or move "
         "the job off shared memory with DOPT_TRANSPORT=tcp on every rank";
}

std::shared_ptr<Segment> Segment::create(const std::string& name, std::size_t bytes, std::size_t reserve) {
  if (bytes == 0) throw ValueError("shm", "segment " + name + " must not be empty");
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    throw IOError("shm", "cannot create shared memory segment " + name + ": " + errno_str(e));
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw IOError("shm", "cannot size shared memory segment " + name + " to " + std::to_string(bytes) +
                             " bytes: " + errno_str(e) + " (is /dev/shm full?)");
  }
  // The pages are allocated now: a tmpfs that is short of room fails here,
  // with a message, instead of a SIGBUS at the first write to a page it
  // cannot back.
  reserve = std::min(reserve, bytes);
  if (reserve > 0) {
    int e;
    do e = ::posix_fallocate(fd, 0, static_cast<off_t>(reserve));
    while (e == EINTR);
    if (e != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw IOError("shm", dev_shm_short_text(name, reserve, e));
    }
  }
  void* p = nullptr;
  try {
    p = map_fd(fd, bytes, name, "shm");
  } catch (...) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw;
  }
  ::close(fd);
  return std::shared_ptr<Segment>(new Segment(name, p, bytes, true));
}

std::shared_ptr<Segment> Segment::open(const std::string& name, std::size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    const int e = errno;
    throw IOError("shm", "cannot open shared memory segment " + name + ": " + errno_str(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes || st.st_size == 0) {
    ::close(fd);
    throw IOError("shm", "shared memory segment " + name + " is smaller than " + std::to_string(bytes) + " bytes");
  }
  void* p = nullptr;
  try {
    p = map_fd(fd, static_cast<std::size_t>(st.st_size), name, "shm");
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return std::shared_ptr<Segment>(new Segment(name, p, static_cast<std::size_t>(st.st_size), false));
}

void Segment::unlink() noexcept {
  if (owner_) ::shm_unlink(name_.c_str());
  owner_ = false;
}

Segment::~Segment() {
  ::munmap(data_, size_);
  if (owner_) ::shm_unlink(name_.c_str());
}

std::size_t Segment::huge_page_bytes() const {
  // Every VMA of [data_, data_ + size_) (one, unless the kernel split it).
  std::FILE* f = std::fopen("/proc/self/smaps", "re");
  if (!f) return 0;
  const auto lo = reinterpret_cast<std::uintptr_t>(data_), hi = lo + size_;
  std::size_t kb = 0;
  bool inside = false;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long a = 0, b = 0;
    char dash = 0;
    if (std::sscanf(line, "%llx%c%llx ", &a, &dash, &b) == 3 && dash == '-') {  // a VMA's first line
      inside = a >= lo && a < hi;
      continue;
    }
    unsigned long long v = 0;
    if (inside && (std::sscanf(line, "ShmemPmdMapped: %llu kB", &v) == 1 ||
                   std::sscanf(line, "FilePmdMapped: %llu kB", &v) == 1))
      kb += static_cast<std::size_t>(v);
  }
  std::fclose(f);
  return kb * 1024;
}

bool populate(void* p, std::size_t bytes, std::string* why) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  if (bytes == 0) return true;
  const auto lo = reinterpret_cast<std::uintptr_t>(p) / 4096 * 4096;
  const auto hi = reinterpret_cast<std::uintptr_t>(p) + bytes;
  if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0) return true;
  const int e = errno;
  if (why) {
    if (e == EFAULT || e == ENOSPC)
      *why = dev_shm_short_text("a staged send", bytes, ENOSPC);
    else if (e == EINVAL)
      *why = "this kernel cannot populate memory ahead (MADV_POPULATE_WRITE, Linux 5.14)";
    else
      *why = errno_str(e);
  }
  return false;
}

bool huge_pages_advised() {
  static const bool on = settings::flag("DOPT_HUGEPAGES").value_or(true);
  return on;
}

std::string dev_shm_huge_mode() {
  std::FILE* f = std::fopen("/proc/self/mounts", "re");
  if (!f) return "";
  std::string mode;  // the last mount on /dev/shm is the one seen
  char line[1024];
  while (std::fgets(line, sizeof line, f)) {
    char dev[256], dir[256], type[64], opts[512];
    if (std::sscanf(line, "%255s %255s %63s %511s", dev, dir, type, opts) != 4 || std::strcmp(dir, "/dev/shm") != 0)
      continue;
    mode = "never";
    const std::string o = std::string(",") + opts + ",";
    const auto at = o.find(",huge=");
    if (at != std::string::npos) mode = o.substr(at + 6, o.find(',', at + 6) - at - 6);
  }
  std::fclose(f);
  if (mode.empty()) return mode;
  if (std::FILE* g = std::fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re")) {
    char buf[256] = {};
    const bool read = std::fgets(buf, sizeof buf, g) != nullptr;
    std::fclose(g);
    if (read && std::strstr(buf, "[deny]")) return "deny";
    if (read && std::strstr(buf, "[force]")) return "force";
  }
  return mode;
}

// --- arena -------------------------------------------------------------------------

struct ShmArena::Impl {
  std::string prefix;
  mutable std::mutex mutex;
  std::uint64_t next = 0;
  std::vector<std::shared_ptr<Segment>> segments;
  std::map<std::size_t, std::vector<Block>> free;  // class -> free blocks
  std::map<std::string, std::shared_ptr<Segment>> by_name;

  void new_segment_for(std::size_t cls) {
    const std::size_t seg_bytes = cls < kSlabBytes ? kSlabBytes : cls;
    auto seg = Segment::create(prefix + std::to_string(next++), seg_bytes);
    segments.push_back(seg);
    by_name[seg->name()] = seg;
    auto& fl = free[cls];
    for (std::size_t off = 0; off + cls <= seg_bytes; off += cls)
      fl.push_back(Block{static_cast<char*>(seg->data()) + off, BlockRef{seg->name(), off, cls}});
  }
};

ShmArena::ShmArena(std::string tag) : impl_(std::make_shared<Impl>()) {
  impl_->prefix = "/dopt-" + std::to_string(::getpid()) + "-" + tag + "-";
}

ShmArena::~ShmArena() {
  // The names go now, as the contract says; blocks still held keep their
  // segment mapped (their deleters hold it) until they die.
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (auto& seg : impl_->segments) seg->unlink();
}

std::shared_ptr<ShmArena::Block> ShmArena::allocate(std::size_t bytes) {
  const std::size_t cls = class_of(bytes == 0 ? 1 : bytes);
  Block b;
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto& fl = impl_->free[cls];
    if (fl.empty()) impl_->new_segment_for(cls);
    b = impl_->free[cls].back();
    impl_->free[cls].pop_back();
    seg = impl_->by_name.at(b.ref.segment);
  }
  std::weak_ptr<Impl> weak = impl_;
  // The deleter holds the segment, so the memory stays mapped even if the
  // arena is destroyed before the last view of the block.
  return std::shared_ptr<Block>(new Block(b), [weak, seg, cls](Block* p) {
    if (auto impl = weak.lock()) {
      std::lock_guard<std::mutex> lock(impl->mutex);
      impl->free[cls].push_back(*p);
    }
    delete p;
  });
}

std::size_t ShmArena::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::size_t n = 0;
  for (auto& s : impl_->segments) n += s->size();
  return n;
}

// --- peers' segments ---------------------------------------------------------------

void* ShmMapCache::resolve(const BlockRef& ref, std::shared_ptr<void>* keep_alive) {
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = segments_.find(ref.segment);
    if (it == segments_.end()) it = segments_.emplace(ref.segment, Segment::open(ref.segment, ref.offset + ref.bytes)).first;
    seg = it->second;
  }
  if (ref.offset + ref.bytes > seg->size())
    throw IOError("shm", "block [" + std::to_string(ref.offset) + ", " + std::to_string(ref.offset + ref.bytes) +
                             ") is outside segment " + ref.segment + " of " + std::to_string(seg->size()) + " bytes");
  if (keep_alive) *keep_alive = seg;
  return static_cast<char*>(seg->data()) + ref.offset;
}

void ShmMapCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  segments_.clear();
}

int remove_stale_segments() {
  DIR* d = ::opendir("/dev/shm");
  if (!d) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind("dopt-", 0) != 0) continue;
    const auto dash = n.find('-', 5);
    if (dash == std::string::npos) continue;
    char* end = nullptr;
    const long pid = std::strtol(n.c_str() + 5, &end, 10);
    if (end != n.c_str() + dash || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // alive
    if (::shm_unlink(("/" + n).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace dopt::shm
