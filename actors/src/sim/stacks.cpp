// The pool of the scheduler's task stacks (stacks.hpp).
#include "sim/stacks.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <new>
#include <vector>

namespace dopt::detail::sim {

namespace {

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102  // Linux 6.13 (uapi asm-generic/mman-common.h)
#endif

/// Stacks per slab: 64 stacks of 256 KiB are a 16 MiB mapping (reserved, not committed).
constexpr std::size_t kSlabStacks = 64;

std::size_t page_bytes() {
  static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

/// How many stacks may have a PROT_NONE guard page (two mappings more each):
/// an eighth of vm.max_map_count (a quarter of it in mappings), the rest
/// left to the rest of the process.
std::size_t guard_page_budget() {
  static const std::size_t budget = [] {
    std::size_t most = 65530;
    std::ifstream f("/proc/sys/vm/max_map_count");
    if (f) f >> most;
    return most / 8;
  }();
  return budget;
}

struct Pool {
  std::mutex m;
  std::size_t bytes = 0;         // usable bytes of every stack
  std::vector<char*> free;       // the stacks' lowest addresses (their guard page)
  bool guard_regions = true;     // until the kernel refuses MADV_GUARD_INSTALL
  std::size_t guard_pages = 0;   // PROT_NONE guard pages made

  std::size_t slot() const { return bytes + page_bytes(); }

  void guard(char* low) {
    if (guard_regions) {
      if (::madvise(low, page_bytes(), MADV_GUARD_INSTALL) == 0) return;
      guard_regions = false;  // EINVAL: a kernel without guard regions
    }
    if (guard_pages < guard_page_budget() && ::mprotect(low, page_bytes(), PROT_NONE) == 0) ++guard_pages;
  }

  void grow() {
    const std::size_t len = kSlabStacks * slot();
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    char* base = static_cast<char*>(p);
    // Handed out from the slab's start: the first stacks at the lowest addresses.
    for (std::size_t i = kSlabStacks; i-- > 0;) {
      char* low = base + i * slot();
      guard(low);
      free.push_back(low);
    }
  }
};

Pool& pool() {
  static auto* p = new Pool();  // never destroyed: abandoned tasks keep their stacks
  return *p;
}

}  // namespace

boost::context::stack_context PooledStack::allocate() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.m);
  if (p.bytes == 0) p.bytes = bytes_;
  if (p.bytes != bytes_) throw std::bad_alloc();  // one size per process (kStackBytes)
  if (p.free.empty()) p.grow();
  char* low = p.free.back();
  p.free.pop_back();
  boost::context::stack_context sctx;
  sctx.size = p.bytes;
  sctx.sp = low + p.slot();
  return sctx;
}

void PooledStack::deallocate(boost::context::stack_context& sctx) noexcept {
  Pool& p = pool();
  char* top = static_cast<char*>(sctx.sp);
  // The touched pages back to the kernel (the guard page keeps its guard).
  ::madvise(top - p.bytes, p.bytes, MADV_DONTNEED);
  std::lock_guard<std::mutex> lock(p.m);
  p.free.push_back(top - p.slot());
}

}  // namespace dopt::detail::sim
