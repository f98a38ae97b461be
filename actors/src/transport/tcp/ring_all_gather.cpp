// ring_all_gather: every input travels around the ring, pipelined per chunk
// (small ones go to every peer at once).
#include "transport/tcp/ring_op.hpp"

namespace dopt::detail {
namespace ring {
namespace {

class AllGatherOp : public RingOp {
 public:
  AllGatherOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
              const RingOptions& opt, const void* input, std::size_t bytes, std::vector<void*> outputs)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        input_(input),
        bytes_(bytes),
        outputs_(std::move(outputs)) {}

 protected:
  void start() override {
    if (outputs_[me_] != input_ && bytes_ > 0) std::memmove(outputs_[me_], input_, bytes_);
    if (bytes_ == 0 || n_ == 1) return;
    if (bytes_ <= opt_.small_bytes) {
      for (int s = 0; s < n_; ++s) {
        if (s == me_) continue;
        send(s, tag(k_small, 0), input_, bytes_, 0);
        recv(s, tag(k_small, 0), outputs_[s], bytes_, [](std::uint32_t) {});
      }
      return;
    }
    const std::size_t ce = std::max<std::size_t>(1, opt_.chunk_bytes);
    const std::size_t nc = (bytes_ + ce - 1) / ce;
    for (int s = 0; s < n_; ++s) {
      auto* seg = static_cast<std::byte*>(outputs_[s]);
      for (std::size_t c = 0; c < nc; ++c) {
        std::byte* p = seg + c * ce;
        const std::size_t b = std::min(ce, bytes_ - c * ce);
        const Tag t = tag(k_ag, std::uint64_t(s));
        if (s == me_) {
          send(next(), t, p, b, 0);
        } else {
          recv(prev(), t, p, b, [this, s, t, p, b](std::uint32_t code) {
            if (next() != s) send(next(), t, p, b, code);
          });
        }
      }
    }
  }

 private:
  const void* input_;
  std::size_t bytes_;
  std::vector<void*> outputs_;
};

// --- broadcast ---------------------------------------------------------------------------

}  // namespace
}  // namespace ring

using namespace ring;

void ring_all_gather(const RingGroup& g, std::uint64_t op_id, const void* input, std::size_t bytes,
                     const std::vector<void*>& outputs, RingDone done, const RingOptions& opt) {
  const std::string name = "all_gather (tcp)";
  check_group(g, name, done, opt);
  const int rank = g.mesh->rank();
  if (outputs.size() != g.ranks.size())
    throw ValueError(name, "expected " + std::to_string(g.ranks.size()) + " outputs, got " +
                               std::to_string(outputs.size()), rank);
  if (bytes > 0) {
    if (!input) throw ValueError(name, "null input", rank);
    for (void* p : outputs)
      if (!p) throw ValueError(name, "null output", rank);
  }
  run<AllGatherOp>(g, op_id, name, std::move(done), opt, input, bytes, outputs);
}

void ring_all_gather(const RingGroup& g, std::uint64_t op_id, const void* input, std::size_t bytes,
                     void* output, RingDone done, const RingOptions& opt) {
  std::vector<void*> outputs(g.ranks.size());
  for (std::size_t s = 0; s < outputs.size(); ++s)
    outputs[s] = output ? static_cast<std::byte*>(output) + s * bytes : nullptr;
  ring_all_gather(g, op_id, input, bytes, outputs, std::move(done), opt);
}

}  // namespace dopt::detail
