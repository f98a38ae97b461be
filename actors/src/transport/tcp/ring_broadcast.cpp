// ring_broadcast: small buffers from the root to every peer, large ones
// down a pipelined chain in ring order.
#include "transport/tcp/ring_op.hpp"

namespace dopt::detail {
namespace ring {
namespace {

class BroadcastOp : public RingOp {
 public:
  BroadcastOp(const RingGroup& g, std::uint64_t id, std::string name, RingDone done,
              const RingOptions& opt, void* buf, std::size_t bytes, int root)
      : RingOp(g, id, std::move(name), std::move(done), opt),
        buf_(static_cast<std::byte*>(buf)),
        bytes_(bytes),
        root_(root) {}

 protected:
  void start() override {
    if (bytes_ == 0 || n_ == 1) return;
    const Tag t = tag(k_bcast, 0);
    if (bytes_ <= opt_.small_bytes) {
      if (me_ == root_) {
        for (int s = 0; s < n_; ++s)
          if (s != me_) send(s, t, buf_, bytes_, 0);
      } else {
        recv(root_, t, buf_, bytes_, [](std::uint32_t) {});
      }
      return;
    }
    const std::size_t ce = std::max<std::size_t>(1, opt_.chunk_bytes);
    const std::size_t nc = (bytes_ + ce - 1) / ce;
    for (std::size_t c = 0; c < nc; ++c) {
      std::byte* p = buf_ + c * ce;
      const std::size_t b = std::min(ce, bytes_ - c * ce);
      if (me_ == root_) {
        send(next(), t, p, b, 0);
      } else {
        recv(prev(), t, p, b, [this, t, p, b](std::uint32_t code) {
          if (next() != root_) send(next(), t, p, b, code);
        });
      }
    }
  }

 private:
  std::byte* buf_;
  std::size_t bytes_;
  int root_;
};

}  // namespace
}  // namespace ring

using namespace ring;

void ring_broadcast(const RingGroup& g, std::uint64_t op_id, void* buf, std::size_t bytes, int root,
                    RingDone done, const RingOptions& opt) {
  const std::string name = "broadcast (tcp)";
  check_group(g, name, done, opt);
  const int rank = g.mesh->rank();
  if (root < 0 || root >= int(g.ranks.size()))
    throw ValueError(name, "root " + std::to_string(root) + " is outside a group of " +
                               std::to_string(g.ranks.size()), rank);
  if (bytes > 0 && !buf) throw ValueError(name, "null buffer", rank);
  run<BroadcastOp>(g, op_id, name, std::move(done), opt, buf, bytes, root);
}

}  // namespace dopt::detail
