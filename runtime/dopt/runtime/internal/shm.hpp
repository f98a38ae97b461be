#pragma once
// POSIX shared memory for the data plane between processes on one host.
//
// A rank stages the bytes its peers must read (or write) in blocks of a
// ShmArena: named segments under /dev/shm that it creates, sized by power-of-
// two classes and reused once free. A block is identified across processes
// by (segment name, offset, size); peers map segments lazily through a
// ShmMapCache and keep the mapping until the cache dies.
//
// Lifetime: the creating process unlinks its segments when its arena is
// destroyed (peers' mappings stay valid until they unmap). Names carry the
// creator's pid ("/dopt-<pid>-<n>"), so remove_stale_segments() can delete
// what a crashed process left behind.
//
// Thread safety: ShmArena and ShmMapCache are safe to use from several
// threads (blocks are often released by whichever thread drops the last
// Tensor view).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dopt::shm {

/// One mapped segment (created or opened). Unmapped when destroyed; unlinked
/// too when this process created it.
class Segment {
 public:
  /// Creates and maps a new segment of `bytes` (> 0), of which the first
  /// `reserve` bytes (all by default) are allocated in /dev/shm at once
  /// (posix_fallocate), so that writing them can never raise SIGBUS when
  /// /dev/shm fills up later; the rest stays sparse (reserve it with
  /// populate() before writing it). Throws IOError naming the segment;
  /// when /dev/shm is short: "cannot reserve N bytes of /dev/shm for NAME:
  /// only M bytes are free there (No space left on device). Give /dev/shm
  /// more room ..., or move the job off shared memory with
  /// DOPT_TRANSPORT=tcp on every rank".
  static std::shared_ptr<Segment> create(const std::string& name, std::size_t bytes,
                                         std::size_t reserve = static_cast<std::size_t>(-1));
  /// Maps an existing segment (created by another process). Throws IOError
  /// when it does not exist or is smaller than `bytes`.
  static std::shared_ptr<Segment> open(const std::string& name, std::size_t bytes);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  /// Removes the segment's name now (peers that mapped it keep their
  /// mapping); the destructor then only unmaps. Idempotent.
  void unlink() noexcept;

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Bytes of this mapping that the kernel backs with huge (PMD-sized)
  /// pages now, as /proc/self/smaps reports them; pages not yet touched
  /// count as not huge; 0 where smaps cannot be read. Reads smaps: for
  /// checks at set-up, not in a loop.
  std::size_t huge_page_bytes() const;
  const std::string& name() const noexcept { return name_; }

 private:
  Segment(std::string name, void* data, std::size_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner) {}
  std::string name_;
  void* data_;
  std::size_t size_;
  bool owner_;
};

/// Where a block lives, as peers see it.
struct BlockRef {
  std::string segment;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

class ShmArena {
 public:
  /// Segment names are "/dopt-<pid>-<tag>-<n>".
  explicit ShmArena(std::string tag);
  ~ShmArena();

  /// A block of at least `bytes` (a zero-byte request gives a 1-byte block).
  /// The returned pointer keeps the block; when the last copy dies the block
  /// returns to the arena (or is unmapped if the arena is gone).
  struct Block {
    void* ptr = nullptr;
    BlockRef ref;
  };
  std::shared_ptr<Block> allocate(std::size_t bytes);

  /// Bytes of all segments this arena created (for tests and stats).
  std::size_t mapped_bytes() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

class ShmMapCache {
 public:
  /// The address of `ref` in this process (maps its segment on first use).
  /// The returned keep-alive holds the mapping.
  void* resolve(const BlockRef& ref, std::shared_ptr<void>* keep_alive = nullptr);
  /// Drops every mapping (views made before stay valid through their keep-alive).
  void clear();

 private:
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Segment>> segments_;
};

/// Allocates the pages of [p, p + bytes) of a shared mapping now
/// (MADV_POPULATE_WRITE), so that writing them cannot raise SIGBUS. False
/// (with the reason in *why, naming /dev/shm when it is full) when the
/// kernel cannot: /dev/shm has no room, or the kernel is older than 5.14.
bool populate(void* p, std::size_t bytes, std::string* why = nullptr);

/// Whether dopt advises large memory for transparent huge pages (large CPU
/// tensors, host_memory's segments): yes unless DOPT_HUGEPAGES=0 (read once).
bool huge_pages_advised();

/// The huge page mode /dev/shm's files get in this process's mount
/// namespace: the huge= option it is mounted with ("never", "always",
/// "within_size", "advise"; "never" when the option is absent), unless the
/// kernel's /sys/kernel/mm/transparent_hugepage/shmem_enabled overrides every
/// tmpfs ("deny" or "force"); "" when /dev/shm is not a mount point here.
std::string dev_shm_huge_mode();

/// Deletes /dev/shm/dopt-<pid>-* segments whose creating process no longer
/// exists. Returns how many were removed.
int remove_stale_segments();

}  // namespace dopt::shm
