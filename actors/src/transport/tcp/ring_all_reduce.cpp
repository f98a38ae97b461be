// ring_all_reduce: small buffers go to every peer and are reduced locally;
// large ones are a reduce-scatter to the segment owners, then an all-gather
// around the ring.
#include "transport/tcp/ring_op.hpp"

namespace dopt::detail {
namespace ring {
namespace {

// The latency path: the whole buffer to every peer, reduced here. Buffers of
// 512 KiB and more travel in pieces of at least 256 KiB (at most 8), each
// reduced as soon as it has come from every peer and gone to every peer
// (the send reads the buffer the result overwrites), so the reduction of
// one piece overlaps the transfer of the next. Element-wise: the result is
// the same bit for bit whatever the pieces. With a root (ring_reduce), the
// other ranks send to the root only and receive nothing; the root sends
// nothing and reduces.
class SmallAllReduceOp : public RingOp {
 public:
  SmallAllReduceOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
                   const RingOptions& opt, void* buf, std::int64_t numel, DType dtype, ReduceOp op, int root)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        buf_(static_cast<std::byte*>(buf)),
        numel_(numel),
        dtype_(dtype),
        op_(op),
        bytes_(std::size_t(numel) * itemsize(dtype)),
        pieces_(pieces_for(numel, bytes_)),
        root_(root),
        left_(std::size_t(pieces_), root < 0 ? 2 * (n_ - 1) : me_ == root ? n_ - 1 : 1),
        scratch_(mesh_, receives() ? std::size_t(n_ - 1) * bytes_ : 0) {}

 protected:
  void start() override {
    auto self = std::static_pointer_cast<SmallAllReduceOp>(shared_from_this());
    for (int p = 0; p < pieces_; ++p) {
      const std::size_t off = lo(p) * itemsize(dtype_), len = (lo(p + 1) - lo(p)) * itemsize(dtype_);
      for (int s = 0; s < n_; ++s) {
        if (s == me_) continue;
        if (root_ < 0 || s == root_)
          send(s, tag(k_small, std::uint64_t(p)), buf_ + off, len, 0, [self, p] { self->piece_done(p); });
        if (receives())
          recv(s, tag(k_small, std::uint64_t(p)), slot(s) + off, len,
               [self, p](std::uint32_t) { self->piece_done(p); });
      }
    }
  }

 private:
  static constexpr std::size_t k_piece_min = std::size_t(256) << 10;
  static constexpr int k_pieces_max = 8;
  static int pieces_for(std::int64_t numel, std::size_t bytes) {
    if (numel <= 0 || bytes < 2 * k_piece_min) return 1;
    return int(std::min<std::size_t>({std::size_t(k_pieces_max), bytes / k_piece_min, std::size_t(numel)}));
  }
  std::int64_t lo(int p) const { return numel_ * p / pieces_; }
  bool receives() const { return root_ < 0 || me_ == root_; }
  // Piece p's messages are all done: reduce it in place (unless the call failed).
  void piece_done(int p) {
    if (--left_[std::size_t(p)] > 0 || error_ || !receives()) return;
    const std::int64_t a = lo(p), count = lo(p + 1) - a;
    const std::size_t off = std::size_t(a) * itemsize(dtype_);
    std::vector<const void*> ins(static_cast<std::size_t>(n_));
    for (int k = 0; k < n_; ++k) ins[k] = k == me_ ? static_cast<const void*>(buf_ + off) : slot(k) + off;
    try {
      reduce_members(ReduceSpec{op_, dtype_, opt_.order, opt_.pre_divisor, numel_}, ins, {buf_ + off}, a, count);
    } catch (...) {  // on the mesh's thread: the call fails with it
      error_ = std::current_exception();
    }
  }
  std::byte* slot(int s) const { return scratch_.get() + std::size_t(s < me_ ? s : s - 1) * bytes_; }
  std::byte* buf_;
  std::int64_t numel_;
  DType dtype_;
  ReduceOp op_;
  std::size_t bytes_;
  int pieces_;
  int root_;  // -1: all_reduce
  std::vector<int> left_;  // per piece: its sends and recvs not yet done
  Buffer scratch_;
};

}  // namespace

void launch_small_all_reduce(const RingGroup& g, std::uint64_t op_id, std::string name, RingDone done,
                             const RingOptions& opt, void* buf, std::int64_t numel, DType dtype, ReduceOp op,
                             int root) {
  run<SmallAllReduceOp>(g, op_id, std::move(name), std::move(done), opt, buf, numel, dtype, op, root);
}
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
    launch_small_all_reduce(g, op_id, name, std::move(done), opt, buf, numel, dtype, op, -1);
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
                        AfterScatter{AfterScatter::all_gather, -1, std::move(segments)});
}

}  // namespace dopt::detail
