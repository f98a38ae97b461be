#pragma once
// Shared by the distributed benchmark programs: the tensor sizes of a model,
// medians, and the per-step time of the slowest rank.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::bench {

/// Sizes of k tensors holding numel elements in all. torch_like: in
/// proportion to 1, 2, ..., 10, 1, 2, ... (the baselines' tensor_sizes), the
/// rounding left-over on the last; else as even as possible.
inline std::vector<std::int64_t> tensor_sizes(std::int64_t numel, std::int64_t k, bool torch_like) {
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(k));
  if (!torch_like) {
    for (std::int64_t i = 0; i < k; ++i) sizes[static_cast<std::size_t>(i)] = numel / k + (i < numel % k ? 1 : 0);
    return sizes;
  }
  std::int64_t wsum = 0;
  for (std::int64_t i = 0; i < k; ++i) wsum += 1 + i % 10;
  std::int64_t used = 0;
  for (std::int64_t i = 0; i < k; ++i) {
    sizes[static_cast<std::size_t>(i)] = numel * (1 + i % 10) / wsum;
    used += sizes[static_cast<std::size_t>(i)];
  }
  sizes.back() += numel - used;
  return sizes;
}

/// The median (the mean of the middle two for an even count); -1 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return -1.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// Collective: element s of the result is the largest v[s] over the ranks of g
/// (every rank passes as many times).
inline std::vector<double> slowest(ProcessGroup& g, const std::vector<double>& v) {
  Tensor t = Tensor::from_vector(v);
  g.all_reduce(t, ReduceOp::max);
  return t.to_vector<double>();
}

}  // namespace dopt::bench
