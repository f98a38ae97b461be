// all_gather (list and flat) on the hierarchical plane: rounds of chunks of
// the input; member j of each host sends its chunk to member j of every other
// host and receives theirs into its buffer, then every host's members copy
// all of them out of each other's buffers.
#include <algorithm>
#include <cstring>

#include "planes/hier/hier_group.hpp"
#include "planes/shm/flat_view.hpp"

namespace dopt::detail::hier {

void all_gather(HierGroup& g, HierCall& c) {
  if (whole_all_gather(g, c)) return;  // one member per host: the TCP ring
  const Op& call = *c.local.op;
  const Topology& t = g.topo();
  Channel& ch = g.local();
  const int H = t.num_hosts(), L = t.per_host(), j = t.local(), me_host = t.host();
  const Tensor& in = call.tensors[0];
  const char* src = static_cast<const char*>(in.data_ptr());
  const std::size_t nb = in.nbytes();
  const shm_plane::FlatView out(call.tensors, 1, call.tensors.size() - 1);
  // Buffer layout of a round: chunk of host h's member (of my local index) at h * per.
  const std::size_t per = std::max<std::size_t>(1, ch.buf_bytes() / static_cast<std::size_t>(H));
  std::size_t lo = 0;
  std::uint64_t chunk = 0;
  do {
    const std::size_t hi = std::min(nb, lo + per), m = hi - lo;
    const std::uint64_t k = ch.begin_round(c.local);
    char* mine = ch.buf(ch.me(), k);
    if (m) std::memcpy(mine + static_cast<std::size_t>(me_host) * per, src + lo, m);
    if (lo == 0) ch.publish(k, call);
    ch.signal(Channel::A(k));
    ch.wait_all(Channel::A(k), c.local);
    if (lo == 0) g.match(k, c);
    Transfers ts(g.mesh());
    std::vector<int> cross;
    for (int h = 0; h < H && m; ++h) {
      if (h == me_host) continue;
      const int peer = t.at(h, j);
      ts.recv(g.global(peer), g.tag(c, HierGroup::kGather, chunk), mine + static_cast<std::size_t>(h) * per, m);
      ts.send(g.global(peer), g.tag(c, HierGroup::kGather, chunk), mine + static_cast<std::size_t>(me_host) * per, m);
      g.count_cross(m);
      cross.push_back(peer);
    }
    g.wait(ts, c, cross);
    ch.signal(Channel::B(k));
    ch.wait_all(Channel::B(k), c.local);
    for (int h = 0; h < H && m; ++h)
      for (int i = 0; i < L; ++i) {
        const std::size_t gr = static_cast<std::size_t>(t.at(h, i));
        out.scatter(gr * nb + lo, gr * nb + hi, ch.buf(i, k) + static_cast<std::size_t>(h) * per);
      }
    lo = hi;
    ++chunk;
  } while (lo < nb);
}

}  // namespace dopt::detail::hier
