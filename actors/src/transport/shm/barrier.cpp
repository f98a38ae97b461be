// barrier on the shared-memory plane: one round without data.
#include "transport/shm/algorithms.hpp"

namespace dopt::detail::shm_plane {

void barrier(Channel& ch, Call& c) { ch.meet(c); }

}  // namespace dopt::detail::shm_plane
