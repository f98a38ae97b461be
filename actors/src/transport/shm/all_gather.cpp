// all_gather (a list of outputs) and all_gather_into_tensor (one output) on
// the shared-memory plane.
#include <algorithm>
#include <cstring>

#include "transport/shm/algorithms.hpp"
#include "transport/shm/flat_view.hpp"

namespace dopt::detail::shm_plane {

namespace {

FlatView outputs_of(const Op& op) {
  // all_gather: [input, out_0, ..., out_{n-1}]; flat: [input, output].
  return FlatView(op.tensors, 1, op.tensors.size() - 1);
}

void staged(Channel& ch, Call& c) {
  const Op& op = *c.op;
  const int n = ch.size(), me = ch.me();
  const Tensor& in = op.tensors[0];
  const char* src = static_cast<const char*>(in.data_ptr());
  const std::size_t nb = in.nbytes(), per = ch.buf_bytes();
  const FlatView out = outputs_of(op);
  std::size_t lo = 0;
  do {
    const std::size_t hi = std::min(nb, lo + per);
    const std::uint64_t k = ch.begin_round(c);
    if (hi > lo) std::memcpy(ch.buf(me, k), src + lo, hi - lo);
    if (lo == 0) ch.publish(k, op);
    ch.signal(Channel::A(k));
    ch.wait_all(Channel::A(k), c);
    if (lo == 0) ch.match(k, c);
    for (int g = 0; g < n; ++g) {
      const std::size_t base = static_cast<std::size_t>(g) * nb;
      out.scatter(base + lo, base + hi, g == me ? src + lo : ch.buf(g, k));
    }
    lo = hi;
  } while (lo < nb);
}

/// The one-round algorithms: after the members met, each member's input goes
/// to its place in the outputs (this member's own input copied, a peer's by
/// `place_peer(out, g, k, base, nb)`), peers in turn from the next one so
/// that not all read the same one at once; nobody returns before all are done.
template <class PlacePeer>
void one_round(Channel& ch, Call& c, PlacePeer&& place_peer) {
  const Op& op = *c.op;
  const int n = ch.size(), me = ch.me();
  const std::size_t nb = op.tensors[0].nbytes();
  const std::uint64_t k = ch.meet(c);
  const FlatView out = outputs_of(op);
  for (int i = 1; i <= n; ++i) {
    const int g = (me + i) % n;
    const std::size_t base = static_cast<std::size_t>(g) * nb;
    if (g == me) out.scatter(base, base + nb, static_cast<const char*>(op.tensors[0].data_ptr()));
    else place_peer(out, g, k, base, nb);
  }
  ch.signal(Channel::B(k));
  ch.wait_all(Channel::B(k), c);
}

void direct(Channel& ch, Call& c) {
  one_round(ch, c, [&](const FlatView& out, int g, std::uint64_t k, std::size_t base, std::size_t nb) {
    out.scatter(base, base + nb, static_cast<const char*>(ch.peer_op(g, k).tensors[0].data_ptr()));
  });
}

/// Processes that may read each other's memory: each reads every peer's
/// input straight into its output (one copy, process_vm_readv); nobody
/// returns before all have read its input.
void cross_memory(Channel& ch, Call& c) {
  one_round(ch, c, [&](const FlatView& out, int g, std::uint64_t k, std::size_t base, std::size_t nb) {
    const std::uint64_t remote = ch.peer_data(g, k);
    out.for_each(base, base + nb, [&](char* p, std::size_t at, std::size_t len) {
      ch.cma_read(g, remote + (at - base), p, len, c);
    });
  });
}

}  // namespace

void all_gather(Channel& ch, Call& c) {
  const std::size_t nb = c.op->tensors[0].nbytes();
  if (ch.in_process() && nb > ch.small_bytes()) return direct(ch, c);
  if (nb > ch.small_bytes() && ch.cma_ready()) return cross_memory(ch, c);
  staged(ch, c);
}

}  // namespace dopt::detail::shm_plane
