// broadcast (and broadcast_coalesced) on the hierarchical plane: rounds of
// buffer-sized chunks; the root stages its chunk, member j of the root's host
// sends slice j of it to member j of every other host, and every host's
// members gather the slices from each other's buffers.
#include <algorithm>
#include <cstring>

#include "transport/hier/hier_group.hpp"
#include "transport/shm/flat_view.hpp"

namespace dopt::detail::hier {

void broadcast(HierGroup& g, HierCall& c) {
  const Op& call = *c.local.op;
  const Topology& t = g.topo();
  Channel& ch = g.local();
  const shm_plane::FlatView v(call.tensors, 0, call.tensors.size());
  const int root = call.desc.root, root_host = t.host_of[static_cast<std::size_t>(root)];
  const int root_local = t.local_of[static_cast<std::size_t>(root)];
  const int L = t.per_host(), j = t.local();
  const bool on_root_host = t.host() == root_host;
  const std::size_t total = v.bytes(), per = ch.buf_bytes();
  std::size_t lo = 0;
  std::uint64_t chunk = 0;
  do {
    const std::size_t hi = std::min(total, lo + per), m = hi - lo;
    const std::uint64_t k = ch.begin_round(c.local);
    if (t.me == root) v.gather(lo, hi, ch.buf(ch.me(), k));
    if (lo == 0) ch.publish(k, call);
    ch.signal(Channel::A(k));
    ch.wait_all(Channel::A(k), c.local);
    if (lo == 0) g.match(k, c);
    const std::size_t slo = m * static_cast<std::size_t>(j) / static_cast<std::size_t>(L);
    const std::size_t shi = m * static_cast<std::size_t>(j + 1) / static_cast<std::size_t>(L);
    Transfers ts(g.mesh());
    std::vector<int> cross;
    if (on_root_host) {
      for (int h = 0; h < t.num_hosts(); ++h) {
        if (h == root_host || shi == slo) continue;
        const int to = t.at(h, j);
        ts.send(g.global(to), g.tag(c, HierGroup::kSlice, chunk), ch.buf(root_local, k) + slo, shi - slo);
        g.count_cross(shi - slo);
        cross.push_back(to);
      }
    } else if (shi > slo) {
      const int from = t.at(root_host, j);
      ts.recv(g.global(from), g.tag(c, HierGroup::kSlice, chunk), ch.buf(ch.me(), k) + slo, shi - slo);
      cross.push_back(from);
    }
    g.wait(ts, c, cross);
    ch.signal(Channel::B(k));
    ch.wait_all(Channel::B(k), c.local);
    if (t.me != root) {
      if (on_root_host) {
        v.scatter(lo, hi, ch.buf(root_local, k));
      } else {
        for (int i = 0; i < L; ++i) {
          const std::size_t a = m * static_cast<std::size_t>(i) / static_cast<std::size_t>(L);
          const std::size_t b = m * static_cast<std::size_t>(i + 1) / static_cast<std::size_t>(L);
          if (b > a) v.scatter(lo + a, lo + b, ch.buf(i, k) + a);
        }
      }
    }
    lo = hi;
    ++chunk;
  } while (lo < total);
}

}  // namespace dopt::detail::hier
