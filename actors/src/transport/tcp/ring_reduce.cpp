// ring_reduce: ring_all_reduce's paths, but only the root receives (small
// buffers: every peer's whole buffer; large ones: each reduced segment from
// its owner), so the other ranks' buffers are only read and never copied.
#include "transport/tcp/ring_op.hpp"

namespace dopt::detail {

using namespace ring;

void ring_reduce(const RingGroup& g, std::uint64_t op_id, void* buf, std::int64_t numel, DType dtype, ReduceOp op,
                 int root, RingDone done, const RingOptions& opt) {
  const std::string name = "reduce (tcp)";
  check_group(g, name, done, opt);
  const int rank = g.mesh->rank();
  check_reduction(dtype, op, name, rank);
  if (numel < 0) throw ValueError(name, "negative numel", rank);
  if (numel > 0 && !buf) throw ValueError(name, "null buffer", rank);
  const int n = int(g.ranks.size());
  if (root < 0 || root >= n)
    throw ValueError(name, "root " + std::to_string(root) + " is outside a group of " + std::to_string(n), rank);
  const std::size_t bytes = std::size_t(numel) * itemsize(dtype);
  if (n == 1 || numel == 0) {  // as ring_all_reduce (n == 1: this rank is the root)
    if ((op == ReduceOp::avg || opt.pre_divisor > 0) && numel > 0)
      reduce_members(ReduceSpec{op, dtype, opt.order, opt.pre_divisor, numel}, {buf}, {buf}, 0, numel);
    g.mesh->post([done = std::move(done)] { done(nullptr); });
    return;
  }
  // The paths and segments of ring_all_reduce, so the root gets its bits.
  if (bytes <= opt.small_bytes || (n == 2 && bytes <= opt.pair_bytes)) {
    launch_small_all_reduce(g, op_id, name, std::move(done), opt, buf, numel, dtype, op, root);
    return;
  }
  std::vector<const void*> inputs(n);
  std::vector<std::int64_t> counts(n);
  auto* base = static_cast<std::byte*>(buf);
  for (int s = 0; s < n; ++s) {
    const std::int64_t lo = std::int64_t(s) * numel / n, hi = std::int64_t(s + 1) * numel / n;
    counts[s] = hi - lo;
    inputs[s] = base + std::size_t(lo) * itemsize(dtype);
  }
  AfterScatter after{AfterScatter::to_root, root, {}};
  void* out = nullptr;
  if (g.me == root) {
    for (int s = 0; s < n; ++s) after.segments.push_back(const_cast<void*>(inputs[s]));
    out = after.segments[g.me];
  }
  launch_reduce_scatter(g, op_id, name, std::move(done), opt, std::move(inputs), std::move(counts), out, dtype, op,
                        std::move(after));
}

}  // namespace dopt::detail
