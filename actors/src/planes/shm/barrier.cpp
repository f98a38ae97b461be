// barrier on the shared-memory plane: one round without data.
#include "planes/shm/algorithms.hpp"

namespace dopt::detail::shm_plane {

void barrier(Channel& ch, Call& c) { ch.meet(c); }

}  // namespace dopt::detail::shm_plane
