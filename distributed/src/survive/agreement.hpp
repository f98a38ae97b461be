#pragma once
// Internal: how the distributed optimizers check that every rank of a group
// agrees on a structure (ZeRO's parameter list, the overlap plan). Each rank
// hashes its structure (FNV-1a), puts the hash and a few counts in a
// descriptor, and all-gathers the descriptors; the caller compares them with
// rank 0's and names the first rank that differs.
#include <cstdint>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::detail {

/// 64-bit FNV-1a over 8-byte words.
class StructureHash {
 public:
  void mix(std::uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h_ ^= (v >> (8 * b)) & 0xff;
      h_ *= 1099511628211ull;
    }
  }
  /// The hash as a non-negative int64 (fits a descriptor entry).
  std::int64_t value() const { return static_cast<std::int64_t>(h_ >> 1); }

 private:
  std::uint64_t h_ = 1469598103934665603ull;
};

/// Collective over group: every rank's descriptor (all the same length), by group rank.
inline std::vector<std::vector<std::int64_t>> all_gather_descriptors(ProcessGroup& group,
                                                                     const std::vector<std::int64_t>& mine) {
  const auto n = static_cast<std::int64_t>(mine.size());
  std::vector<Tensor> outs;
  for (int r = 0; r < group.size(); ++r) outs.push_back(Tensor::zeros({n}, DType::int64));
  group.all_gather(outs, Tensor::from_vector(mine));
  std::vector<std::vector<std::int64_t>> all;
  for (const auto& t : outs) all.push_back(t.to_vector<std::int64_t>());
  return all;
}

}  // namespace dopt::optim::detail
