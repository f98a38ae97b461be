// ProcessGroup's coalesced calls on planes that do not run them natively
// (the actor plane: deterministic tests, TCP between hosts): one flat copy,
// one collective, the results copied back.
#include <algorithm>

#include "internal.hpp"
#include "kernels.hpp"

namespace dopt::detail {

namespace {

Tensor flatten(const std::vector<Tensor>& ts, DType dt) {
  std::int64_t total = 0;
  for (const auto& t : ts) total += static_cast<std::int64_t>(t.nbytes() / itemsize(dt));
  Tensor flat = Tensor::empty({total}, dt);
  std::size_t off = 0;
  for (const auto& t : ts) {
    if (t.nbytes()) std::memcpy(static_cast<char*>(flat.data_ptr()) + off, t.data_ptr(), t.nbytes());
    off += t.nbytes();
  }
  return flat;
}

void unflatten(const Tensor& flat, const std::vector<Tensor>& ts) {
  std::size_t off = 0;
  for (const auto& t : ts) {
    if (t.nbytes()) std::memcpy(t.data_ptr(), static_cast<const char*>(flat.data_ptr()) + off, t.nbytes());
    off += t.nbytes();
  }
}

/// In-place sum in gloo's ring order with send/recv (blocking): the buffer
/// in 2n segments of ceil(bytes / 2n) bytes (whole elements), rank c owns
/// segments 2c and 2c + 1, whose sum starts at rank c + 1 and goes round.
void ring_sum(ProcessGroup& group, const Tensor& flat) {
  const int n = group.size();
  const int me = group.rank();
  const std::int64_t numel = flat.numel();
  const std::size_t es = flat.element_size();
  const std::size_t total = static_cast<std::size_t>(numel) * es;
  const std::size_t segs = static_cast<std::size_t>(2 * n);
  std::size_t seg_bytes = (total + segs - 1) / segs;
  seg_bytes = (seg_bytes + es - 1) / es * es;
  const std::int64_t seg = static_cast<std::int64_t>(seg_bytes / es);
  auto chunk = [&](int c) {
    c = ((c % n) + n) % n;
    const std::int64_t b = std::min<std::int64_t>(numel, 2 * c * seg);
    const std::int64_t e = std::min<std::int64_t>(numel, 2 * (c + 1) * seg);
    return flat.flat_slice(b, e - b);
  };
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  Tensor tmp = Tensor::empty({std::max<std::int64_t>(1, 2 * seg)}, flat.dtype());
  const ReduceSpec add{ReduceOp::sum, flat.dtype(), ReduceOrder::rank, 0, 0};
  for (int s = 0; s < n - 1; ++s) {  // reduce-scatter: received partial + own
    Tensor out = chunk(me - 1 - s);
    Tensor in = chunk(me - 2 - s);
    Future<void> sf, rf;
    Tensor rbuf = tmp.flat_slice(0, in.numel());
    if (out.numel()) sf = group.send_async(out, next, 7000 + s);
    if (in.numel()) rf = group.recv_async(rbuf, prev, 7000 + s);
    if (rf.valid()) {
      rf.get();
      reduce_members(add, {rbuf.data_ptr(), in.data_ptr()}, {in.data_ptr()}, 0, in.numel());
    }
    if (sf.valid()) sf.get();
  }
  for (int s = 0; s < n - 1; ++s) {  // all-gather
    Tensor out = chunk(me - s);
    Tensor in = chunk(me - 1 - s);
    Future<void> sf, rf;
    if (out.numel()) sf = group.send_async(out, next, 7100 + s);
    if (in.numel()) rf = group.recv_async(in, prev, 7100 + s);
    if (rf.valid()) rf.get();
    if (sf.valid()) sf.get();
  }
}

}  // namespace

Future<void> emulate_all_reduce_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors,
                                          const AllReduceCoalescedOptions& options, bool blocking) {
  const DType dt = tensors[0].dtype();
  Tensor flat = flatten(tensors, dt);
  if (options.pre_divisor > 0) {
    const ReduceSpec div{ReduceOp::sum, dt, ReduceOrder::rank, options.pre_divisor, flat.numel()};
    reduce_members(div, {flat.data_ptr()}, {flat.data_ptr()}, 0, flat.numel());
  }
  if (options.order == ReduceOrder::ring && pg.size() >= 3 && (dt == DType::float32 || dt == DType::float64)) {
    ring_sum(pg, flat);
    unflatten(flat, tensors);
    return blocking ? Future<void>() : make_ready_future();
  }
  if (blocking) {
    pg.all_reduce(flat, options.op);
    unflatten(flat, tensors);
    return Future<void>();
  }
  return pg.all_reduce_async(flat, options.op).then([flat, tensors](Future<void> f) {
    f.get();
    unflatten(flat, tensors);
  });
}

Future<void> emulate_broadcast_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int src,
                                         bool blocking) {
  Tensor flat = flatten(tensors, DType::uint8);
  if (blocking) {
    pg.broadcast(flat, src);
    unflatten(flat, tensors);
    return Future<void>();
  }
  return pg.broadcast_async(flat, src).then([flat, tensors](Future<void> f) {
    f.get();
    unflatten(flat, tensors);
  });
}

}  // namespace dopt::detail
