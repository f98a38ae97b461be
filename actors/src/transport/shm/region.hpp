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
inline constexpr std::uint32_t kRegionVersion = 4;
inline constexpr int kMaxDims = 8;
inline constexpr std::size_t kExtraBytes = 192;
inline constexpr std::size_t kCallerBytes = 64;
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
  /// 1 once the owner broke the group (its wait timed out), 2 when it did so
  /// on a lost member; `why` says how.
  std::atomic<std::uint32_t> aborted{0};
  /// The sequence number of the call in which the owner broke the group
  /// (written before `aborted`): the owner took its part in every earlier
  /// call, so only the calls from this one on fail with its reason.
  std::atomic<std::uint64_t> seq{0};
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
  std::uint64_t data_addr = 0;   // the owner's first tensor, in its address space (processes: read with CMA)
  char extra[kExtraBytes] = {};
  char caller[kCallerBytes] = {};  // the public call that issued it (cut; not compared), for errors
};

struct ControlBlock {
  std::uint64_t magic = 0;
  std::uint64_t gid = 0;
  std::uint32_t version = 0;
  std::uint32_t global_rank = 0;
  std::uint32_t group_size = 0;
  std::int32_t pid = 0;
  std::uint64_t bytes = 0;  // of the whole region
  std::uint64_t self_addr = 0;  // where the owner maps this region (what a peer's CMA probe reads)
  /// Set by the owner before its first step: 1 when it can read every peer's
  /// memory with process_vm_readv (cross-memory attach), 2 when it cannot.
  std::atomic<std::uint32_t> cma{0};
  /// The same for point to point (send/recv): 1 when this member reads the
  /// messages sent to it straight from the senders' tensors, 2 when it needs
  /// them staged. Set with `cma`.
  std::atomic<std::uint32_t> p2p_cma{0};
  SyncLine sync;
  StatusLine status;
  AbortLine abort;
  alignas(64) char why[kWhyBytes] = {};
  alignas(64) Desc desc[2];  // index: round % 2
};

// --- point to point ----------------------------------------------------------------
// A sender publishes a message to member d in its own mailbox for d (a ring
// of kMailSlots headers; the bytes stay with the sender: its tensor between
// threads, and between processes its tensor too when the receiver can read
// the sender's memory (cross-memory attach: the receiver copies once, with
// process_vm_readv), else a staged copy in the sender's send heap or
// shared-memory arena). The
// receiver copies headers out as they come (and says so in its read line),
// matches them with its recvs by (tag, sequence number), copies the bytes
// and acknowledges in its ack ring for the sender. Both ring the other's
// doorbell, on which an idle member's point-to-point engine sleeps.

inline constexpr std::uint64_t kMailSlots = 32;

struct alignas(64) Doorbell {
  std::atomic<std::uint32_t> ring{0};
  std::atomic<std::uint32_t> sleepers{0};
};

struct alignas(64) MailSlot {
  std::atomic<std::uint64_t> id{0};         // message id (from 1) once published
  std::atomic<std::uint32_t> cancelled{0};  // the sender gave up on it (timeout)
  std::int32_t tag = 0;
  std::uint64_t seq = 0;
  std::uint8_t dtype = 0;
  std::int8_t ndim = 0;
  std::int64_t shape[kMaxDims] = {};
  std::uint64_t shape_hash = 0;
  std::uint64_t nbytes = 0;
  std::uint64_t addr = 0;    // threads, and processes with `direct`: the sender's data (its address space)
  std::uint32_t direct = 0;  // processes: 1 when the receiver reads `addr` with process_vm_readv (no staged copy)
  std::uint64_t offset = 0;  // processes: the block's offset in the sender's heap, or in `segment`
  char segment[64] = {};     // processes: "" (the block is in the sender's heap) or an arena segment
};

enum class AckStatus : std::uint32_t { ok = 0, mismatch = 1, cancelled = 2, receiver_failed = 3 };

struct alignas(64) AckSlot {
  std::atomic<std::uint64_t> id{0};  // the message id this acknowledges
  std::uint32_t status = 0;          // AckStatus
  char why[244] = {};
};

struct alignas(64) ReadLine {
  std::atomic<std::uint64_t> read_upto{0};  // headers of ids <= this were copied out
};

/// Where the parts of a region lie, for a group of n members.
struct Layout {
  int n = 0;
  std::size_t buf_bytes = 0;
  std::size_t heap_bytes = 0;
  std::size_t doorbell = 0, mail = 0, ack = 0, read = 0, buf = 0, heap = 0, total = 0;

  /// heap_bytes: where a process stages the bytes it sends (0 between threads).
  static Layout of(int n, std::size_t buf_bytes, std::size_t heap_bytes) {
    auto page = [](std::size_t x) { return (x + 4095) / 4096 * 4096; };
    Layout l;
    l.n = n;
    l.buf_bytes = buf_bytes;
    std::size_t at = (sizeof(ControlBlock) + 63) / 64 * 64;
    l.doorbell = at;
    at += sizeof(Doorbell);
    l.mail = at;  // [dst][slot]
    at += static_cast<std::size_t>(n) * kMailSlots * sizeof(MailSlot);
    l.ack = at;  // [src][slot]
    at += static_cast<std::size_t>(n) * kMailSlots * sizeof(AckSlot);
    l.read = at;  // [src]
    at += static_cast<std::size_t>(n) * sizeof(ReadLine);
    l.buf = page(at);
    l.heap = l.buf + 2 * buf_bytes;
    l.heap_bytes = heap_bytes;
    l.total = l.heap + heap_bytes;
    return l;
  }
  char* at(void* base, std::size_t off) const { return static_cast<char*>(base) + off; }
  Doorbell* doorbell_of(void* base) const { return reinterpret_cast<Doorbell*>(at(base, doorbell)); }
  MailSlot* mail_slot(void* base, int dst, std::uint64_t id) const {
    return reinterpret_cast<MailSlot*>(at(base, mail)) + static_cast<std::size_t>(dst) * kMailSlots + id % kMailSlots;
  }
  AckSlot* ack_slot(void* base, int src, std::uint64_t id) const {
    return reinterpret_cast<AckSlot*>(at(base, ack)) + static_cast<std::size_t>(src) * kMailSlots + id % kMailSlots;
  }
  ReadLine* read_line(void* base, int src) const {
    return reinterpret_cast<ReadLine*>(at(base, read)) + static_cast<std::size_t>(src);
  }
  char* heap_of(void* base) const { return at(base, heap); }
  /// Staging buffer of round `round`.
  char* buf_of(void* base, std::uint64_t round) const { return at(base, buf) + (round % 2) * buf_bytes; }
};

}  // namespace dopt::detail::shm_plane
