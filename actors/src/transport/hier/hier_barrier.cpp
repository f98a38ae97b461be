// barrier on the hierarchical plane: a round on each host, then every
// member swaps its record with its cross peers (HierGroup::match), which
// tells it that every host's members arrived.
#include "transport/hier/hier_group.hpp"

namespace dopt::detail::hier {

void barrier(HierGroup& g, HierCall& c) { g.meet(c); }

}  // namespace dopt::detail::hier
