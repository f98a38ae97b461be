// barrier on the hierarchical plane: a round on each host, then every
// member swaps its record with its cross peers (HierGroup::match), which
// tells it that every host's members arrived.
#include "planes/hier/hier_group.hpp"

namespace dopt::detail::hier {

void barrier(HierGroup& g, HierCall& c) {
  Channel& ch = g.local();
  const std::uint64_t k = ch.begin_round(c.local);
  ch.publish(k, *c.local.op);
  ch.signal(Channel::A(k));
  ch.wait_all(Channel::A(k), c.local);
  g.match(k, c);
}

}  // namespace dopt::detail::hier
