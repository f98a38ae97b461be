#pragma once
// The cost of one call under a sim::NetworkModel: what the real planes'
// algorithms would take for this layout and size (docs/testing.md, "A network
// model", has the formulas in words). Pure functions of their arguments: any
// thread, no state; the scheduler (network.cpp) charges the result.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dopt/actors/internal/op.hpp"
#include "dopt/actors/sim.hpp"

namespace dopt::detail::sim {

struct CallCost {
  std::int64_t ns = 0;
  /// Bytes each host sends on its link (index: host; empty: none crossed).
  std::vector<std::uint64_t> link_bytes;
};

/// The host of global rank r among world_size ranks.
int host_of(const dopt::sim::NetworkModel& m, int world_size, int r);

/// A collective of `kind` over the global ranks `members` (ascending), with
/// `bytes` the size of its descriptor's tensor (all_gather: one input;
/// reduce_scatter: one output; coalesced: the whole buffer) and `root` the
/// global rank of a broadcast's root (else ignored). Collective kinds only
/// (send/recv: send_cost; new_group and barrier: synchronisations only).
CallCost collective_cost(const dopt::sim::NetworkModel& m, int world_size, CollKind kind, std::size_t bytes,
                         const std::vector<int>& members, int root = -1);

/// A send of `bytes` from global rank src to dst.
CallCost send_cost(const dopt::sim::NetworkModel& m, int world_size, std::size_t bytes, int src, int dst);

}  // namespace dopt::detail::sim
