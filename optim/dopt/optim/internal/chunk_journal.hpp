#pragma once
// Internal (not installed): the journal of the CPU optimizer kernels' writes
// (kernel_support.hpp runs every kernel through it while one is set), for
// ZeroRedundancyOptimizer's host-memory redundancy (dopt/distributed,
// zero_host_keep.cpp), which records the pre-images of what a step overwrites.
#include <cstddef>
#include <cstdint>

namespace dopt::optim::kernels {

using i64 = std::int64_t;

/// Where the kernel call in flight saves the pre-images of what it writes
/// (see ChunkJournal): for each array it writes (as the call sees it), the
/// image its values go to before they are overwritten, one cache line at a
/// time, and the count of elements saved so far (stored after the line's
/// images, before the line's new values).
struct LineJournal {
  const void* out[8] = {};
  char* image[8] = {};
  std::size_t count = 0;
  std::int64_t* progress = nullptr;
  std::size_t matched = 0;  // of out[], those a kernel listed among its streams (set by line_plan)
};

/// A journal of the kernels' writes, chunk by chunk (ZeroRedundancyOptimizer's
/// host-memory redundancy, zero_host_keep.cpp). For each chunk [b, b + len)
/// of a kernel call over n elements, before() gets the arrays the kernel
/// writes (its non-const pointer arguments, null ones left out, as the chunk's
/// call sees them) and fills `lines` for them; the kernel then saves their
/// pre-images line by line as it goes (DOPT_FOR_EACH_ELEMENT); after() runs
/// once the chunk is done.
struct ChunkJournal {
  virtual ~ChunkJournal() = default;
  virtual void before(void* const* outs, std::size_t count, std::size_t elem_size, i64 b, i64 len) = 0;
  virtual void after(i64 b, i64 len) = 0;
  i64 chunk = 0;  // elements per chunk (0: the whole call)
  LineJournal lines;
};

/// The calling thread's journal (null: kernels run whole). Set, every kernel
/// entry point runs through run_journaled, and the element loops of the
/// chunk's call save into its `lines`.
inline ChunkJournal*& chunk_journal() {
  static thread_local ChunkJournal* j = nullptr;
  return j;
}

}  // namespace dopt::optim::kernels
