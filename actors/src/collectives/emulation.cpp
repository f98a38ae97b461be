// ProcessGroup's coalesced calls on planes that do not run them natively
// (the actor plane: deterministic tests, TCP between hosts): one flat copy,
// one collective, the results copied back.
#include <algorithm>

#include "collectives/group.hpp"

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

}  // namespace

Future<void> emulate_all_reduce_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors,
                                          const AllReduceCoalescedOptions& options, bool blocking) {
  Tensor flat = flatten(tensors, tensors[0].dtype());
  if (blocking) {
    all_reduce_with(pg, flat, options, true);
    unflatten(flat, tensors);
    return Future<void>();
  }
  return all_reduce_with(pg, flat, options, false).then([flat, tensors](Future<void> f) {
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
