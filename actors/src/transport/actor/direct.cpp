// The actor plane's work split on direct-access buffers (simulated ranks,
// and small calls between processes whose bytes came inline): group rank r
// of n reduces elements [r*numel/n, (r+1)*numel/n) over every member's input
// and writes them into every member's output (reduce-scatter and all-gather
// in one pass); every element is written by one rank only.
#include <cstring>

#include "transport/actor/rank_state.hpp"
#include "plane/kernels.hpp"

namespace dopt::detail {

void RankState::compute(const CollState& st) {
  const auto& op = *st.local;
  const int n = static_cast<int>(st.members->size());
  const int me = op.my_grank;
  auto arr = [&](int g) -> const Arrival& { return *st.arrivals[static_cast<std::size_t>(g)]; };
  auto copy = [](const Tensor& dst, std::size_t dst_off, const Tensor& src) {
    auto* d = static_cast<char*>(dst.data_ptr()) + dst_off;
    const void* s = src.data_ptr();
    if (d != s && src.nbytes()) std::memmove(d, s, src.nbytes());
  };
  switch (op.desc.kind) {
    case CollKind::all_reduce:
    case CollKind::reduce: {
      const std::int64_t numel = op.tensors[0].numel();
      std::int64_t lo = numel * me / n, hi = numel * (me + 1) / n;
      std::vector<const void*> ins;
      std::vector<void*> outs;
      for (int g = 0; g < n; ++g) ins.push_back(arr(g).tensors[0].data_ptr());
      if (st.small) {  // peers' inputs are private copies: compute all of our own result
        if (op.desc.kind == CollKind::reduce && me != op.desc.root) break;
        lo = 0;
        hi = numel;
        outs.push_back(op.tensors[0].data_ptr());
      } else if (op.desc.kind == CollKind::all_reduce) {
        for (int g = 0; g < n; ++g) outs.push_back(arr(g).tensors[0].data_ptr());
      } else {
        outs.push_back(arr(op.desc.root).tensors[0].data_ptr());
      }
      const std::size_t skip = static_cast<std::size_t>(lo) * itemsize(op.desc.dtype);
      for (auto& p : ins) p = static_cast<const char*>(p) + skip;
      for (auto& p : outs) p = static_cast<char*>(p) + skip;
      const ReduceSpec spec{op.desc.op, op.desc.dtype, op.desc.order, op.desc.pre_divisor, numel};
      reduce_members(spec, ins, outs, lo, hi - lo);
      break;
    }
    case CollKind::broadcast:
      if (me != op.desc.root) copy(op.tensors[0], 0, arr(op.desc.root).tensors[0]);
      break;
    case CollKind::all_gather:
      for (int g = 0; g < n; ++g) copy(op.tensors[static_cast<std::size_t>(1 + g)], 0, arr(g).tensors[0]);
      break;
    case CollKind::all_gather_flat: {
      const std::size_t nb = op.tensors[0].nbytes();
      for (int g = 0; g < n; ++g) copy(op.tensors[1], nb * static_cast<std::size_t>(g), arr(g).tensors[0]);
      break;
    }
    case CollKind::reduce_scatter: {
      std::vector<const void*> ins;
      for (int g = 0; g < n; ++g) ins.push_back(arr(g).tensors[static_cast<std::size_t>(1 + me)].data_ptr());
      std::vector<void*> outs{op.tensors[0].data_ptr()};
      reduce_range(op.desc.op, op.desc.dtype, ins, outs, 0, op.tensors[0].numel());
      break;
    }
    default:
      break;
  }
}

}  // namespace dopt::detail
