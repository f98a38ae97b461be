#pragma once
// The memory one rank owns in one group on the shared-memory plane: a
// control block (its step word, status, what it called) and two staging
// buffers. Between processes it is a /dev/shm segment that every member
// maps; between threads (simulated ranks) it is ordinary memory.
//
// Single writer: only the owner writes its region, except the `waiters`
// counter of its sync line, which peers increment while they sleep on it.
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace dopt::detail::shm_plane {

inline constexpr std::uint64_t kRegionMagic = 0x31676572746f6f64ULL;  // "doopreg1" (little-endian)
inline constexpr std::uint32_t kRegionVersion = 1;
inline constexpr int kMaxDims = 8;
inline constexpr std::size_t kExtraBytes = 192;
inline constexpr std::size_t kWhyBytes = 1024;

/// The owner's progress: it only ever grows. Round k of the group's
/// collectives has two steps: A(k) = 2k+1 ("my data of round k is in my
/// buffer") and B(k) = 2k+2 ("my share of round k is written").
struct alignas(64) SyncLine {
  std::atomic<std::uint64_t> step{0};
  std::atomic<std::uint32_t> futex{0};    // bumped after every step change; peers sleep on it
  std::atomic<std::uint32_t> waiters{0};  // peers asleep on futex (the owner wakes them)
};

struct alignas(64) StatusLine {
  /// Highest sequence number + 1 the owner has submitted to this group: a
  /// failed owner still runs these.
  std::atomic<std::uint64_t> submitted{0};
};

struct alignas(64) AbortLine {
  /// 1 once the owner broke the group (its wait timed out); `why` says how.
  std::atomic<std::uint32_t> aborted{0};
};

/// What the owner called in the first round of an operation.
struct Desc {
  std::uint64_t seq = 0;
  std::uint8_t kind = 0, op = 0, dtype = 0, variant = 0;
  std::int32_t root = -1;
  std::int32_t ndim = 0;
  std::int32_t extra_len = 0;
  std::int64_t shape[kMaxDims] = {};
  std::uint64_t shape_hash = 0;  // every dimension, also beyond kMaxDims
  std::uint64_t extra_hash = 0;
  std::uint64_t op_ptr = 0;      // threads only: the owner's Op (direct algorithms)
  char extra[kExtraBytes] = {};
};

struct ControlBlock {
  std::uint64_t magic = 0;
  std::uint64_t gid = 0;
  std::uint32_t version = 0;
  std::uint32_t global_rank = 0;
  std::uint32_t group_size = 0;
  std::int32_t pid = 0;
  std::uint64_t buf_bytes = 0;
  SyncLine sync;
  StatusLine status;
  AbortLine abort;
  alignas(64) char why[kWhyBytes] = {};
  alignas(64) Desc desc[2];  // index: round % 2
};

/// Bytes before the staging buffers (page aligned).
inline constexpr std::size_t kControlBytes = (sizeof(ControlBlock) + 4095) / 4096 * 4096;

inline std::size_t region_bytes(std::size_t buf_bytes) { return kControlBytes + 2 * buf_bytes; }

/// Staging buffer of round `round` in a region starting at base.
inline char* region_buf(void* base, std::size_t buf_bytes, std::uint64_t round) {
  return static_cast<char*>(base) + kControlBytes + (round % 2) * buf_bytes;
}

}  // namespace dopt::detail::shm_plane
