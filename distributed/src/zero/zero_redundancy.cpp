// Redundancy (zero_redundancy.hpp): the default buckets, NoRedundancy, and
// the choice of the mode at construction.
#include "zero_redundancy.hpp"

#include "zero_buddies.hpp"
#include "zero_core.hpp"

namespace dopt::optim::zero_detail {

void Redundancy::build_buckets(ZeroCore& z) { z.buckets.build(z.part, z.rank, z.repoint); }

void NoRedundancy::start(ZeroCore& z, const ZeroOptions&) {
  if (z.bucket_view) build_buckets(z);
}

std::optional<ZeroRecovery> NoRedundancy::finish_step(ZeroCore& z, Future<void>& notify) {
  z.post_shards(notify).get();  // what step_async leaves in flight
  ++z.steps;
  return std::nullopt;
}

ZeroRecovery NoRedundancy::recover(ZeroCore& z) {
  throw StateError("ZeroRedundancyOptimizer.recover",
                   "recovery needs ZeroOptions::redundancy > 0 (no rank keeps a copy of another's state)", z.rank);
}

bool NoRedundancy::keeps_state_of(const ZeroCore& z, std::size_t i) const { return z.part.owner(i) == z.rank; }

void NoRedundancy::install_state(ZeroCore& z, StateByParam local) { z.optim->state() = std::move(local); }

std::unique_ptr<Redundancy> make_redundancy(const ZeroOptions& options) {
  if (options.redundancy <= 0 || options.overlap_with_ddp) return std::make_unique<NoRedundancy>();
  switch (options.buddy_update) {
    case ZeroBuddyUpdate::replay:
      return std::make_unique<ReplayBuddies>(options.redundancy, options.snapshot_interval);
    case ZeroBuddyUpdate::host_memory:
      return std::make_unique<HostMemoryBuddies>(options.redundancy, options.host_memory_chunk);
    case ZeroBuddyUpdate::step:
      break;
  }
  return std::make_unique<CopyBuddies>(options.redundancy);
}

}  // namespace dopt::optim::zero_detail
