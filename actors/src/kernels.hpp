#pragma once
// Reduction kernels of the in-process (direct memory) collective algorithms.
#include <cstdint>
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

}  // namespace dopt::detail
