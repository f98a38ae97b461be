// all_gather (list and flat) on the hierarchical plane. Member j of each host
// sends its input to member j of every other host, in pieces of
// buf_bytes / hosts (tag: the piece's index), and receives theirs; then the
// members of a host take the others' inputs and what they received from each
// other. Two ways, the same messages on the mesh either way (so hosts that
// take different ways still meet):
//
// * cross-memory (processes that can read each other's memory, inputs of at
//   least 1 MiB): the pieces travel straight between the
//   tensors (sent from the input, received into the output); meanwhile each
//   member copies its own input and reads its host peers' inputs into its
//   output with process_vm_readv; once every member of the host has received
//   its pieces, each reads what the others received straight from their
//   outputs. Three copies per byte that crosses with two members per host,
//   against five staged.
// * staged: rounds of chunks through the members' shared-memory buffers.
#include <algorithm>
#include <cstring>
#include <memory>

#include "transport/hier/hier_group.hpp"
#include "transport/shm/flat_view.hpp"

namespace dopt::detail::hier {

namespace {

using shm_plane::FlatView;

/// Inputs from this size up take the cross-memory way where they can. 2
/// hosts x 2 ranks, alternated runs (docs/performance.md, 2026-12-05): an
/// input of 256 KiB took 1.14x the staged time, 1 MiB 0.93x, 4 MiB 0.88x.
constexpr std::size_t k_cross_memory_bytes = std::size_t(1) << 20;

/// The bytes of one piece on the mesh (the same on every host).
std::size_t piece_bytes(Channel& ch, int hosts) {
  return std::max<std::size_t>(1, ch.buf_bytes() / static_cast<std::size_t>(hosts));
}

/// The staged way; `matched`: the call's first round is done and matched
/// (its rounds start afresh).
void staged(HierGroup& g, HierCall& c, bool matched) {
  const Op& call = *c.local.op;
  const Topology& t = g.topo();
  Channel& ch = g.local();
  const int H = t.num_hosts(), L = t.per_host(), j = t.local(), me_host = t.host();
  const Tensor& in = call.tensors[0];
  const char* src = static_cast<const char*>(in.data_ptr());
  const std::size_t nb = in.nbytes();
  const FlatView out(call.tensors, 1, call.tensors.size() - 1);
  // Buffer layout of a round: chunk of host h's member (of my local index) at h * per.
  const std::size_t per = piece_bytes(ch, H);
  std::size_t lo = 0;
  std::uint64_t chunk = 0;
  do {
    const std::size_t hi = std::min(nb, lo + per), m = hi - lo;
    const std::uint64_t k = ch.begin_round(c.local);
    char* mine = ch.buf(ch.me(), k);
    if (m) std::memcpy(mine + static_cast<std::size_t>(me_host) * per, src + lo, m);
    const bool first = lo == 0 && !matched;
    if (first) ch.publish(k, call);
    ch.signal(Channel::A(k));
    ch.wait_all(Channel::A(k), c.local);
    if (first) g.match(k, c);
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

/// Reads host member i's bytes at `remote` (its address space) into bytes
/// [lo, lo + n) of out.
void read_into(HierGroup& g, HierCall& c, int i, std::uint64_t remote, const FlatView& out, std::size_t lo,
               std::size_t n) {
  out.for_each(lo, lo + n, [&](char* p, std::size_t at, std::size_t len) {
    g.local().cma_read(i, remote + (at - lo), p, len, c.local);
  });
  g.count_cma(n);
}

}  // namespace

void all_gather(HierGroup& g, HierCall& c) {
  if (whole_all_gather(g, c)) return;  // one member per host: the TCP ring
  const Op& call = *c.local.op;
  const Topology& t = g.topo();
  Channel& ch = g.local();
  const std::size_t nb = call.tensors[0].nbytes();
  if (nb < k_cross_memory_bytes || !g.members_are_processes()) return staged(g, c, false);

  const int H = t.num_hosts(), L = t.per_host(), j = t.local(), me_host = t.host();
  const char* src = static_cast<const char*>(call.tensors[0].data_ptr());
  const FlatView out(call.tensors, 1, call.tensors.size() - 1);
  auto slot = [&](int gr) { return static_cast<std::size_t>(gr) * nb; };  // group rank gr's bytes in out
  // The first round carries where each member's output receives each host's
  // piece (0 where that range is not one piece of memory).
  std::vector<std::uint64_t> mine(static_cast<std::size_t>(H));
  for (int h = 0; h < H; ++h)
    mine[static_cast<std::size_t>(h)] = reinterpret_cast<std::uint64_t>(out.contiguous(slot(t.at(h, j)), nb));
  const std::uint64_t k = g.meet(c, mine);
  const auto table = g.cross_memory_entries(k, static_cast<std::size_t>(H));
  if (table.empty()) return staged(g, c, true);

  // The pieces, straight between the tensors (which outlive transfers that
  // a failed wait leaves behind).
  const std::shared_ptr<void> keep = std::make_shared<std::vector<Tensor>>(call.tensors);
  const std::size_t per = piece_bytes(ch, H);
  Transfers ts(g.mesh());
  std::vector<int> cross;
  for (int h = 0; h < H; ++h) {
    if (h == me_host) continue;
    const int peer = t.at(h, j);
    char* into = reinterpret_cast<char*>(mine[static_cast<std::size_t>(h)]);
    std::uint64_t piece = 0;
    for (std::size_t lo = 0; lo < nb; lo += per, ++piece) {
      const std::size_t m = std::min(per, nb - lo);
      ts.recv(g.global(peer), g.tag(c, HierGroup::kGather, piece), into + lo, m, keep);
      ts.send(g.global(peer), g.tag(c, HierGroup::kGather, piece), src + lo, m, keep);
    }
    g.count_cross(nb);
    cross.push_back(peer);
  }
  // Meanwhile: this member's input, and its host peers'.
  out.scatter(slot(t.me), slot(t.me) + nb, src);
  for (int d = 1; d < L; ++d) {
    const int i = (j + d) % L;
    read_into(g, c, i, ch.peer_data(i, k), out, slot(t.at(me_host, i)), nb);
  }
  g.wait(ts, c, cross);
  ch.signal(Channel::B(k));
  ch.wait_all(Channel::B(k), c.local);
  // What the host peers received.
  for (int d = 1; d < L; ++d) {
    const int i = (j + d) % L;
    for (int h = 0; h < H; ++h)
      if (h != me_host) read_into(g, c, i, table[static_cast<std::size_t>(i)][static_cast<std::size_t>(h)], out, slot(t.at(h, i)), nb);
  }
  // Nobody returns (its tensors free to change) before every member read them.
  ch.sync(c.local);
}

}  // namespace dopt::detail::hier
