// ring_reduce_scatter: the owner of segment s receives segment s of every
// input and reduces it in group-rank order (also the first half of
// ring_all_reduce and ring_reduce).
#include "transport/tcp/ring_op.hpp"

namespace dopt::detail {
namespace ring {
namespace {

// --- reduce-scatter (+ all-gather for all_reduce) -------------------------------------
//
// Owner of segment s receives segment s of every input, reduces chunk c once all
// n contributions of chunk c are there, in group-rank order. With all_gather, the
// reduced chunk goes to the next rank and travels around the ring; with to_root,
// straight to the root (a rank other than the root reduces it over the scratch
// slot of its first peer's contribution and sends it from there).
//
// Scratch: the contributions of `w_` chunks of this rank's segment. When the
// window covers the whole segment it is exactly (n-1) segments (slots peer by
// peer); otherwise w_ * (n-1) full chunks, reused round robin.
class ReduceScatterOp : public RingOp {
 public:
  ReduceScatterOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
                  const RingOptions& opt, std::vector<const void*> inputs,
                  std::vector<std::int64_t> counts, void* output, DType dtype, ReduceOp op,
                  AfterScatter after)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        inputs_(std::move(inputs)),
        counts_(std::move(counts)),
        output_(static_cast<std::byte*>(output)),
        dtype_(dtype),
        op_(op),
        isz_(itemsize(dtype)),
        ce_(std::max<std::int64_t>(1, std::int64_t(opt.chunk_bytes / itemsize(dtype)))),
        all_gather_(after.kind == AfterScatter::all_gather),
        to_root_(after.kind == AfterScatter::to_root),
        root_(after.root),
        segments_(std::move(after.segments)) {}

 protected:
  void start() override {
    if (n_ == 1) {
      reduce_members(spec(), {inputs_[0]}, {output_}, 0, counts_[0]);
      return;
    }
    // 1. My contribution to every other segment, straight to its owner.
    for (int s = 0; s < n_; ++s) {
      if (s == me_) continue;
      const auto* in = static_cast<const std::byte*>(inputs_[s]);
      for (std::size_t c = 0; c < chunks(counts_[s], ce_); ++c)
        send(s, tag(k_rs, 0), in + c * ce_ * isz_, len(s, c) * isz_, 0);
    }
    // 2. The other contributions to my segment, `window` chunks ahead (more
    //    within scratch_bytes).
    nc_ = chunks(counts_[me_], ce_);
    if (nc_ > 0) {
      slot_elems_ = std::min<std::int64_t>(ce_, counts_[me_]);
      const std::size_t per_chunk = std::size_t(n_ - 1) * std::size_t(slot_elems_) * isz_;
      w_ = std::min<std::size_t>(std::max<std::size_t>(std::size_t(opt_.window), opt_.scratch_bytes / per_chunk), nc_);
      whole_ = w_ == nc_;
      scratch_ = Buffer(
          mesh_, std::size_t(n_ - 1) * isz_ * (whole_ ? std::size_t(counts_[me_]) : w_ * std::size_t(slot_elems_)));
      arrived_.assign(nc_, 0);
      if (sends_from_scratch()) sent_.assign(nc_, 0);
      posted_ = w_;
      code_.assign(nc_, 0);
      for (std::size_t c = 0; c < w_; ++c) post_chunk(c);
    }
    // 3. ring_reduce: the root receives every other reduced segment from its owner.
    if (to_root_ && me_ == root_) {
      for (int s = 0; s < n_; ++s) {
        if (s == me_) continue;
        auto* seg = static_cast<std::byte*>(segments_[s]);
        for (std::size_t c = 0; c < chunks(counts_[s], ce_); ++c)
          recv(s, tag(k_root, std::uint64_t(s)), seg + c * ce_ * isz_, len(s, c) * isz_, [](std::uint32_t) {});
      }
    }
    // 3. ring_all_reduce: receive every other reduced segment from the previous rank.
    if (all_gather_) {
      for (int s = 0; s < n_; ++s) {
        if (s == me_) continue;
        auto* seg = static_cast<std::byte*>(segments_[s]);
        for (std::size_t c = 0; c < chunks(counts_[s], ce_); ++c) {
          std::byte* p = seg + c * ce_ * isz_;
          const std::size_t bytes = len(s, c) * isz_;
          recv(prev(), tag(k_ag, std::uint64_t(s)), p, bytes, [this, s, p, bytes](std::uint32_t code) {
            if (next() != s) send(next(), tag(k_ag, std::uint64_t(s)), p, bytes, code);
          });
        }
      }
    }
  }

 private:
  std::size_t len(int s, std::size_t c) const {
    return std::size_t(std::min<std::int64_t>(ce_, counts_[s] - std::int64_t(c) * ce_));
  }
  std::byte* slot(std::size_t c, int peer_index) const {
    if (whole_) return scratch_.get() + (std::size_t(peer_index) * std::size_t(counts_[me_]) + c * ce_) * isz_;
    return scratch_.get() + ((c % w_) * std::size_t(n_ - 1) + std::size_t(peer_index)) * slot_elems_ * isz_;
  }
  // to_root off the root: the reduced chunk c lives in this slot until its send completes.
  bool sends_from_scratch() const { return to_root_ && me_ != root_; }
  static int peer_index(int me, int s) { return s < me ? s : s - 1; }

  void post_chunk(std::size_t c) {
    for (int s = 0; s < n_; ++s) {
      if (s == me_) continue;
      recv(s, tag(k_rs, 0), slot(c, peer_index(me_, s)), len(me_, c) * isz_, [this, c](std::uint32_t code) {
        if (code != 0 && code_[c] == 0) code_[c] = code;
        ++arrived_[c];
        advance();
      });
    }
  }

  void advance() {
    while (next_ < nc_ && arrived_[next_] == n_ - 1) {
      const std::size_t c = next_++;
      reduce_chunk(c);
      if (c + w_ < nc_ && !sends_from_scratch()) post_chunk(c + w_);
    }
  }

  void reduce_chunk(std::size_t c) {
    const std::size_t off = c * std::size_t(ce_) * isz_;
    std::byte* out = sends_from_scratch() ? slot(c, 0) : output_ + off;
    if (code_[c] == 0) {
      std::vector<const void*> ins(static_cast<std::size_t>(n_));
      for (int k = 0; k < n_; ++k)
        ins[k] = k == me_ ? static_cast<const std::byte*>(inputs_[me_]) + off : slot(c, peer_index(me_, k));
      // The chunk's place in the whole buffer (all_reduce, reduce: my segment's start).
      const auto* mine = static_cast<const std::byte*>(inputs_[me_]);
      const auto* first = static_cast<const std::byte*>(inputs_[0]);
      const std::int64_t seg_lo = whole_buffer() ? std::int64_t((mine - first) / isz_) : 0;
      reduce_members(spec(), ins, {out}, seg_lo + std::int64_t(c) * ce_, std::int64_t(len(me_, c)));
    }
    if (all_gather_) send(next(), tag(k_ag, std::uint64_t(me_)), out, len(me_, c) * isz_, code_[c]);
    if (sends_from_scratch()) {
      // The slot is free again once the send has handed its bytes to the kernel.
      // Chunks are posted in order (their recvs match the peers' messages in
      // order), whatever order the sends complete in.
      send(root_, tag(k_root, std::uint64_t(me_)), out, len(me_, c) * isz_, code_[c], [this, c] {
        sent_[c] = 1;
        while (posted_ < nc_ && sent_[posted_ - w_]) post_chunk(posted_++);
      });
    }
  }
  bool whole_buffer() const { return all_gather_ || to_root_; }

  ReduceSpec spec() const {
    std::int64_t total = 0;
    for (auto k : counts_) total += k;
    return ReduceSpec{op_, dtype_, opt_.order, opt_.pre_divisor, whole_buffer() ? total : counts_[me_]};
  }

  std::vector<const void*> inputs_;
  std::vector<std::int64_t> counts_;
  std::byte* output_;
  DType dtype_;
  ReduceOp op_;
  std::size_t isz_;
  std::int64_t ce_;
  bool all_gather_;
  bool to_root_;
  int root_;
  std::vector<void*> segments_;
  std::size_t nc_ = 0, w_ = 0, next_ = 0;
  bool whole_ = false;  // the window covers the whole segment: slots peer by peer
  std::int64_t slot_elems_ = 0;
  Buffer scratch_;
  std::vector<int> arrived_;
  std::vector<char> sent_;  // to_root off the root: chunk c's reduced slot has been sent
  std::size_t posted_ = 0;  // chunks whose recvs are posted
  std::vector<std::uint32_t> code_;
};

// --- small all_reduce: every buffer to every rank, reduce locally in rank order -------

}  // namespace

void launch_reduce_scatter(const RingGroup& g, std::uint64_t op_id, std::string name, RingDone done,
                           const RingOptions& opt, std::vector<const void*> inputs, std::vector<std::int64_t> counts,
                           void* output, DType dtype, ReduceOp op, AfterScatter after) {
  run<ReduceScatterOp>(g, op_id, std::move(name), std::move(done), opt, std::move(inputs), std::move(counts), output,
                       dtype, op, std::move(after));
}

}  // namespace ring

using namespace ring;

void ring_reduce_scatter(const RingGroup& g, std::uint64_t op_id,
                         const std::vector<const void*>& inputs,
                         const std::vector<std::int64_t>& counts, void* output, DType dtype,
                         ReduceOp op, RingDone done, const RingOptions& opt) {
  const std::string name = "reduce_scatter (tcp)";
  check_group(g, name, done, opt);
  const int rank = g.mesh->rank();
  check_reduction(dtype, op, name, rank);
  const int n = int(g.ranks.size());
  if (int(inputs.size()) != n || int(counts.size()) != n)
    throw ValueError(name, "expected " + std::to_string(n) + " inputs and counts, got " +
                               std::to_string(inputs.size()) + " and " + std::to_string(counts.size()),
                     rank);
  for (int s = 0; s < n; ++s) {
    if (counts[s] < 0) throw ValueError(name, "negative count for group rank " + std::to_string(s), rank);
    if (counts[s] > 0 && !inputs[s])
      throw ValueError(name, "null input for group rank " + std::to_string(s), rank);
  }
  if (counts[g.me] > 0 && !output) throw ValueError(name, "null output", rank);
  launch_reduce_scatter(g, op_id, name, std::move(done), opt, inputs, counts, output, dtype, op, AfterScatter{});
}

}  // namespace dopt::detail
