// reduce_scatter on the shared-memory plane: member r's output is the
// reduction of every member's inputs[r].
#include <algorithm>
#include <cstring>
#include <vector>

#include "plane/kernels.hpp"
#include "transport/shm/algorithms.hpp"

namespace dopt::detail::shm_plane {

namespace {

/// Rounds of chunks: member r stages chunk c of inputs[g] for every g != r
/// (piece g of its buffer), then reduces piece r over all buffers.
void staged(Channel& ch, Call& c) {
  const Op& op = *c.op;
  const int n = ch.size(), me = ch.me();
  const std::size_t es = itemsize(op.desc.dtype);
  const Tensor& out = op.tensors[0];
  const std::int64_t m = out.numel();
  const std::int64_t per = std::max<std::int64_t>(1, static_cast<std::int64_t>(ch.buf_bytes() / (es * static_cast<std::size_t>(n))));
  const ReduceSpec spec = reduce_spec_of(op, m);
  std::vector<const void*> ins(static_cast<std::size_t>(n));
  std::vector<void*> outs(1);
  std::int64_t c0 = 0;
  do {
    const std::int64_t cnt = std::min(per, m - c0);
    const std::uint64_t k = ch.begin_round(c);
    char* mine = ch.buf(me, k);
    const std::size_t piece = static_cast<std::size_t>(per) * es;
    for (int g = 0; g < n; ++g) {
      if (g == me || cnt <= 0) continue;
      std::memcpy(mine + static_cast<std::size_t>(g) * piece,
                  static_cast<const char*>(op.tensors[static_cast<std::size_t>(1 + g)].data_ptr()) + static_cast<std::size_t>(c0) * es,
                  static_cast<std::size_t>(cnt) * es);
    }
    if (c0 == 0) ch.publish(k, op);
    ch.signal(Channel::A(k));
    ch.wait_all(Channel::A(k), c);
    if (c0 == 0) ch.match(k, c);
    if (cnt > 0) {
      for (int g = 0; g < n; ++g)
        ins[static_cast<std::size_t>(g)] =
            g == me ? static_cast<const char*>(op.tensors[static_cast<std::size_t>(1 + me)].data_ptr()) + static_cast<std::size_t>(c0) * es
                    : ch.buf(g, k) + static_cast<std::size_t>(me) * piece;
      outs[0] = static_cast<char*>(out.data_ptr()) + static_cast<std::size_t>(c0) * es;
      reduce_members(spec, ins, outs, c0, cnt);
    }
    c0 += per;
  } while (c0 < m);
}

void direct(Channel& ch, Call& c) {
  const Op& op = *c.op;
  const int n = ch.size(), me = ch.me();
  const std::uint64_t k = ch.meet(c);
  std::vector<const void*> ins(static_cast<std::size_t>(n));
  for (int g = 0; g < n; ++g) {
    const Op& po = g == me ? op : ch.peer_op(g, k);
    ins[static_cast<std::size_t>(g)] = po.tensors[static_cast<std::size_t>(1 + me)].data_ptr();
  }
  std::vector<void*> outs{op.tensors[0].data_ptr()};
  const std::int64_t m = op.tensors[0].numel();
  reduce_members(reduce_spec_of(op, m), ins, outs, 0, m);
  ch.signal(Channel::B(k));
  ch.wait_all(Channel::B(k), c);
}

}  // namespace

void reduce_scatter(Channel& ch, Call& c) {
  const std::size_t bytes = c.op->tensors[0].nbytes() * static_cast<std::size_t>(ch.size());
  if (ch.in_process() && bytes > ch.small_bytes()) return direct(ch, c);
  staged(ch, c);
}

}  // namespace dopt::detail::shm_plane
