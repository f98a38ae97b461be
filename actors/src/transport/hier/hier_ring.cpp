// One member per host: all_reduce and all_gather as the TCP ring collectives
// (dopt/actors/internal/ring.hpp) among the group's members, straight on the tensors'
// memory. With one member per host the two-level algorithms have nothing to
// do within a host, and their rounds of shared-memory staging (a copy in, a
// copy out, the pipeline drained at each round's end) only cost time; the
// ring keeps the link busy in both directions, chunk after chunk, and
// reduces in the group's order (bit for bit what the other planes give).
#include <algorithm>
#include <cstring>
#include <memory>

#include "plane/kernels.hpp"
#include "transport/hier/hier_group.hpp"
#include "transport/shm/flat_view.hpp"
#include "dopt/actors/internal/ring.hpp"

namespace dopt::detail::hier {

namespace {

RingGroup ring_of(HierGroup& g) {
  const Topology& t = g.topo();
  return RingGroup{&g.mesh(), t.members, t.me};
}

std::vector<int> others(const Topology& t) {
  std::vector<int> v;
  for (int r = 0; r < static_cast<int>(t.members.size()); ++r)
    if (r != t.me) v.push_back(r);
  return v;
}

/// Data of at most this many bytes per call travels while the match records
/// do. With the mesh's scratch pool and a polling I/O thread the round trip
/// the records cost is 11-20 % of a 1-4 MiB call between two hosts
/// (docs/performance.md, 2026-12-05); above, data that arrives before its
/// recv is posted costs the mesh a buffer and a copy of it, more than the
/// round trip saves.
constexpr std::size_t k_match_overlap_bytes = std::size_t(4) << 20;

/// The call's only round on this host (one member: nothing to wait for), and
/// the match records posted to the cross peers. Up to k_match_overlap_bytes
/// (or the ring's small_bytes, when larger) they are not awaited here: the
/// data travels while they do (one round trip less), and their verdict is a
/// transfer of ts, waited for with the data (a mismatch ends that wait; the
/// call's own transfers stay behind). Larger data waits for the match,
/// which also brings the ranks into step, so that each rank's recvs are
/// posted before the data arrives.
void open_call(HierGroup& g, HierCall& c, std::size_t bytes, const RingOptions& opt, Transfers& ts) {
  Channel& ch = g.local();
  const std::uint64_t k = ch.begin_round(c.local);
  ch.publish(k, *c.local.op);
  ch.signal(Channel::A(k));
  ch.wait_all(Channel::A(k), c.local);
  if (bytes <= std::max(opt.small_bytes, k_match_overlap_bytes)) return g.start_match(k, c, ts.expect());
  g.match(k, c);
}

/// What a collective in flight needs alive after a failed wait gave up on it:
/// the caller's tensors (their storage) and a packing buffer.
struct Keep {
  std::vector<Tensor> tensors;
  BufferPool::Lease packed;  // from the mesh's pool: memory used before, no page faults
};

}  // namespace

bool whole_all_reduce(HierGroup& g, HierCall& c, const std::vector<Tensor>& tensors, DType dtype, ReduceOp op) {
  const Topology& t = g.topo();
  if (t.per_host() != 1) return false;
  const Op& call = *c.local.op;
  const shm_plane::FlatView v(tensors, 0, tensors.size());
  RingOptions opt;
  opt.order = call.desc.order;
  opt.pre_divisor = call.desc.pre_divisor;
  Transfers ts(g.mesh());
  open_call(g, c, v.bytes(), opt, ts);
  const std::size_t bytes = v.bytes(), es = itemsize(dtype);
  const std::int64_t numel = static_cast<std::int64_t>(bytes / es);
  const int n = static_cast<int>(t.members.size());
  auto keep = std::make_shared<Keep>();
  keep->tensors = tensors;
  char* buf = bytes ? v.contiguous(0, bytes) : nullptr;
  if (bytes && !buf) {  // several tensors (coalesced), or not contiguous: one buffer
    keep->packed = g.mesh().buffers().take(bytes);
    buf = reinterpret_cast<char*>(keep->packed.get());
    v.gather(0, bytes, buf);
  }
  detail::ring_all_reduce(ring_of(g), c.op_id, buf, numel, dtype, op, ts.expect(keep), opt);
  // Bytes this rank sends: every peer's share of the buffer (the latency
  // path: the whole buffer to each); then the reduced segments but the next rank's.
  if (n > 1 && numel > 0) {
    if (bytes <= opt.small_bytes || (n == 2 && bytes <= opt.pair_bytes)) {
      g.count_cross(bytes * static_cast<std::size_t>(n - 1));
    } else {
      auto seg = [&](int s) {
        return static_cast<std::size_t>((std::int64_t(s + 1) * numel / n) - (std::int64_t(s) * numel / n)) * es;
      };
      g.count_cross((bytes - seg(t.me)) + (bytes - seg((t.me + 1) % n)));
    }
  }
  g.wait(ts, c, others(t));
  if (buf && buf == reinterpret_cast<char*>(keep->packed.get())) v.scatter(0, bytes, buf);
  return true;
}

bool whole_all_gather(HierGroup& g, HierCall& c) {
  const Topology& t = g.topo();
  if (t.per_host() != 1) return false;
  const Op& call = *c.local.op;
  const Tensor& in = call.tensors[0];
  const std::size_t nb = in.nbytes();
  const int n = static_cast<int>(t.members.size());
  const shm_plane::FlatView out(call.tensors, 1, call.tensors.size() - 1);
  const RingOptions opt;
  Transfers ts(g.mesh());
  open_call(g, c, nb, opt, ts);
  if (nb == 0) {
    g.wait(ts, c, others(t));
    return true;
  }
  auto keep = std::make_shared<Keep>();
  keep->tensors = call.tensors;
  // Each member's part of the output straight from the tensors when it is
  // one range of memory; else the whole output in one buffer, copied out.
  std::vector<void*> outputs(static_cast<std::size_t>(n));
  bool packed = false;
  for (int s = 0; s < n; ++s) {
    outputs[static_cast<std::size_t>(s)] = out.contiguous(static_cast<std::size_t>(s) * nb, nb);
    packed = packed || !outputs[static_cast<std::size_t>(s)];
  }
  if (packed) {
    keep->packed = g.mesh().buffers().take(nb * static_cast<std::size_t>(n));
    for (int s = 0; s < n; ++s) outputs[static_cast<std::size_t>(s)] = keep->packed.get() + static_cast<std::size_t>(s) * nb;
  }
  detail::ring_all_gather(ring_of(g), c.op_id, in.data_ptr(), nb, outputs, ts.expect(keep), opt);
  g.count_cross(nb * static_cast<std::size_t>(n - 1));
  g.wait(ts, c, others(t));
  if (packed) out.scatter(0, nb * static_cast<std::size_t>(n), reinterpret_cast<const char*>(keep->packed.get()));
  return true;
}

}  // namespace dopt::detail::hier
