#pragma once
// Internal to dopt_actors: the shared-memory plane's limit on its one-round
// all_reduce between processes, shared by the plane
// (transport/shm/all_reduce.cpp, which picks its algorithm by it) and the
// network model (sim/network_cost.cpp, which charges the algorithm the plane
// would pick); here, below both (the seam), as neither may include the
// other. A constant: any thread.
#include <cstddef>

namespace dopt::detail::shm_plane {

/// Between processes, the one-round way is taken while what each receiver
/// reduces (members x bytes) stays within this many small calls' worth
/// (ShmPlane::Options::small_bytes each).
inline constexpr std::size_t kOneRoundSmallCalls = 64;

}  // namespace dopt::detail::shm_plane
