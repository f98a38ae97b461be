// barrier on the shared-memory plane: one round without data.
#include "planes/shm/algorithms.hpp"

namespace dopt::detail::shm_plane {

void barrier(Channel& ch, Call& c) {
  const std::uint64_t k = ch.begin_round(c);
  ch.publish(k, *c.op);
  ch.signal(Channel::A(k));
  ch.wait_all(Channel::A(k), c);
  ch.match(k, c);
}

}  // namespace dopt::detail::shm_plane
