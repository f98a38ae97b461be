#pragma once
// Reduction kernels of the in-process (direct memory) collective algorithms.
#include <cstdint>
#include <cstddef>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/dtype.hpp"

namespace dopt::detail {

/// For i in [lo, lo + count):
///   acc = ins[0][i] op ins[1][i] op ... op ins[n-1][i]   (in this order)
///   (avg: acc / ins.size())
///   outs[k][i] = acc for every k.
/// Elements are of dtype; accumulation in the dtype's C++ type (float for the
/// 16-bit floats, rounded once); integer sum/product wrap around.
/// ins and outs may alias (element i is read from every input before any
/// output element i is written).
void reduce_range(ReduceOp op, DType dtype, const std::vector<const void*>& ins,
                  const std::vector<void*>& outs, std::int64_t lo, std::int64_t count);

/// How a collective combines its members' contributions.
struct ReduceSpec {
  ReduceOp op = ReduceOp::sum;
  DType dtype = DType::float32;
  ReduceOrder order = ReduceOrder::rank;
  std::int64_t pre_divisor = 0;  // > 0: each contribution is divided by it first (in its dtype)
  std::int64_t total = 0;        // elements of the whole flat buffer (ReduceOrder::ring cuts it)
};

struct Op;
/// The reduction a call asks for (its descriptor's op, dtype, order and
/// pre_divisor) over a flat buffer of `total` elements.
ReduceSpec reduce_spec_of(const Op& op, std::int64_t total);

/// Elements [global_lo, global_lo + count) of the flat buffer: ins[g] points
/// at group rank g's element global_lo, outs[k] where the results go. The
/// contributions are combined in rank order, or for ReduceOrder::ring (float32
/// and float64; 16-bit floats accumulate in float32 in rank order) in gloo's
/// ring order, which depends on the element's position in the whole buffer;
/// otherwise as reduce_range.
void reduce_members(const ReduceSpec& spec, const std::vector<const void*>& ins, const std::vector<void*>& outs,
                    std::int64_t global_lo, std::int64_t count);

/// The order reduce_members combines the members' contributions in, for
/// elements [lo, lo + count): runs of elements with the group ranks in order.
struct RankRun {
  std::int64_t lo = 0, count = 0;
  std::vector<int> order;
};
std::vector<RankRun> reduction_order(const ReduceSpec& spec, int n, std::int64_t lo, std::int64_t count);

// A reduction computed in pieces (the hierarchical plane's chain of hosts):
// the accumulator is of the accumulation type (float for float16/bfloat16,
// else the dtype), so the pieces give reduce_members' bits.
std::size_t acc_itemsize(DType dtype);
/// acc_out = (acc_in, or ins[0] when acc_in is null) op ins[k] ... in order;
/// every contribution divided by pre_divisor first (> 0). acc_out may alias acc_in.
void accumulate(ReduceOp op, DType dtype, std::int64_t pre_divisor, const void* acc_in,
                const std::vector<const void*>& ins, void* acc_out, std::int64_t count);
/// out = acc (avg: divided by n, the number of contributions) in the dtype.
void finalize(ReduceOp op, DType dtype, std::int64_t n, const void* acc, void* out, std::int64_t count);

}  // namespace dopt::detail
