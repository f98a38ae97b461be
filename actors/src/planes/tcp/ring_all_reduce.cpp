// ring_all_reduce: small buffers go to every peer and are reduced locally;
// large ones are a reduce-scatter to the segment owners, then an all-gather
// around the ring.
#include "planes/tcp/ring_op.hpp"

namespace dopt::detail {
namespace ring {
namespace {

class SmallAllReduceOp : public RingOp {
 public:
  SmallAllReduceOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
                   const RingOptions& opt, void* buf, std::int64_t numel, DType dtype, ReduceOp op)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        buf_(static_cast<std::byte*>(buf)),
        numel_(numel),
        dtype_(dtype),
        op_(op),
        bytes_(std::size_t(numel) * itemsize(dtype)),
        scratch_(mesh_, std::size_t(n_ - 1) * bytes_) {}

 protected:
  void start() override {
    for (int s = 0; s < n_; ++s) {
      if (s == me_) continue;
      send(s, tag(k_small, 0), buf_, bytes_, 0);
      recv(s, tag(k_small, 0), slot(s), bytes_, [](std::uint32_t) {});
    }
  }
  void on_complete() override {  // every send is out: buf may be overwritten
    std::vector<const void*> ins(static_cast<std::size_t>(n_));
    for (int k = 0; k < n_; ++k) ins[k] = k == me_ ? static_cast<const void*>(buf_) : slot(k);
    reduce_members(ReduceSpec{op_, dtype_, opt_.order, opt_.pre_divisor, numel_}, ins, {buf_}, 0, numel_);
  }

 private:
  std::byte* slot(int s) const { return scratch_.get() + std::size_t(s < me_ ? s : s - 1) * bytes_; }
  std::byte* buf_;
  std::int64_t numel_;
  DType dtype_;
  ReduceOp op_;
  std::size_t bytes_;
  Buffer scratch_;
};

// --- all_gather ------------------------------------------------------------------------

}  // namespace
}  // namespace ring

using namespace ring;

void ring_all_reduce(const RingGroup& g, std::uint64_t op_id, void* buf, std::int64_t numel,
                     DType dtype, ReduceOp op, RingDone done, const RingOptions& opt) {
  const std::string name = "all_reduce (tcp)";
  check_group(g, name, done, opt);
  check_reduction(dtype, op, name, g.mesh->rank());
  if (numel < 0) throw ValueError(name, "negative numel", g.mesh->rank());
  if (numel > 0 && !buf) throw ValueError(name, "null buffer", g.mesh->rank());
  const int n = int(g.ranks.size());
  const std::size_t bytes = std::size_t(numel) * itemsize(dtype);
  if (n == 1 || numel == 0) {
    // Nothing to exchange; avg of one rank is x / 1 (bit-identical to x).
    if ((op == ReduceOp::avg || opt.pre_divisor > 0) && numel > 0)
      reduce_members(ReduceSpec{op, dtype, opt.order, opt.pre_divisor, numel}, {buf}, {buf}, 0, numel);
    g.mesh->post([done = std::move(done)] { done(nullptr); });
    return;
  }
  if (bytes <= opt.small_bytes || (n == 2 && bytes <= opt.pair_bytes)) {
    run<SmallAllReduceOp>(g, op_id, name, std::move(done), opt, buf, numel, dtype, op);
    return;
  }
  // Segment s = [s*numel/n, (s+1)*numel/n), like the in-process algorithm.
  std::vector<const void*> inputs(n);
  std::vector<void*> segments(n);
  std::vector<std::int64_t> counts(n);
  auto* base = static_cast<std::byte*>(buf);
  for (int s = 0; s < n; ++s) {
    const std::int64_t lo = std::int64_t(s) * numel / n, hi = std::int64_t(s + 1) * numel / n;
    counts[s] = hi - lo;
    segments[s] = base + std::size_t(lo) * itemsize(dtype);
    inputs[s] = segments[s];
  }
  void* out = segments[g.me];
  launch_reduce_scatter(g, op_id, name, std::move(done), opt, std::move(inputs), std::move(counts), out, dtype, op,
                        true, std::move(segments));
}

}  // namespace dopt::detail
