#pragma once
// Internal to dopt_actors: the stacks of the deterministic scheduler's tasks
// (scheduler.cpp, Scheduler::add). A Boost.Context stack allocator: the
// fiber keeps a copy and calls deallocate when it is destroyed (never for an
// abandoned task's fiber). Any thread; the pool is shared by every
// simulation in the process under one lock.
//
// Stacks are carved from slabs (one mapping each, many stacks), so that a
// simulation of tens of thousands of tasks stays far below the kernel's
// limit on mappings (vm.max_map_count): a stack of its own mapping and a
// guard page is two. Each stack's lowest page is a guard page: a guard
// region (madvise MADV_GUARD_INSTALL, which does not split the mapping)
// where the kernel has them, else a PROT_NONE page (two mappings more) for
// as many stacks as keep the mappings within a quarter of the limit, and
// none past that. A freed stack's pages go back to the kernel (MADV_DONTNEED)
// and the stack to the pool.
#include <cstddef>

#include <boost/context/stack_context.hpp>

namespace dopt::detail::sim {

class PooledStack {
 public:
  /// Stacks of `bytes` usable bytes (a multiple of the page size; one size per process).
  explicit PooledStack(std::size_t bytes) noexcept : bytes_(bytes) {}
  /// A stack from the pool, or from a new slab (std::bad_alloc when none can be mapped).
  boost::context::stack_context allocate();
  void deallocate(boost::context::stack_context& sctx) noexcept;

 private:
  std::size_t bytes_;
};

}  // namespace dopt::detail::sim
