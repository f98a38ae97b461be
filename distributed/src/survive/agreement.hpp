#pragma once
// Internal: how the distributed optimizers check that every rank of a group
// agrees on a structure (ZeRO's parameter list, the overlap plan). Each rank
// hashes its structure (FNV-1a), puts the hash and a few counts in a
// descriptor, and all-gathers the descriptors; the caller compares them with
// rank 0's and names the first rank that differs.
#include <algorithm>
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

/// Every rank's descriptor, by group rank, in one flat buffer: a group of R
/// ranks costs each rank R x n words, not R tensors (at thousands of
/// simulated ranks in one process, R tensors on each rank were R x R
/// allocations). all[r] is a copy of rank r's descriptor.
class Descriptors {
 public:
  Descriptors(std::vector<std::int64_t> flat, std::size_t n) : flat_(std::move(flat)), n_(n) {}
  std::size_t size() const { return n_ == 0 ? 0 : flat_.size() / n_; }
  std::vector<std::int64_t> operator[](std::size_t r) const {
    const auto first = flat_.begin() + static_cast<std::ptrdiff_t>(r * n_);
    return {first, first + static_cast<std::ptrdiff_t>(n_)};
  }
  /// Word i of rank r's descriptor (no copy).
  std::int64_t at(std::size_t r, std::size_t i) const { return flat_[r * n_ + i]; }
  /// Whether ranks a and b passed the same descriptor (no copy).
  bool same(std::size_t a, std::size_t b) const {
    const auto at_a = flat_.begin() + static_cast<std::ptrdiff_t>(a * n_);
    return std::equal(at_a, at_a + static_cast<std::ptrdiff_t>(n_), flat_.begin() + static_cast<std::ptrdiff_t>(b * n_));
  }

 private:
  std::vector<std::int64_t> flat_;
  std::size_t n_;
};

/// Collective over group: every rank's descriptor (all the same length), by
/// group rank (one all_gather_into_tensor).
inline Descriptors all_gather_descriptors(ProcessGroup& group, const std::vector<std::int64_t>& mine) {
  const auto n = static_cast<std::int64_t>(mine.size());
  Tensor out = Tensor::zeros({n * group.size()}, DType::int64);
  group.all_gather_into_tensor(out, Tensor::from_vector(mine));
  return Descriptors(out.to_vector<std::int64_t>(), static_cast<std::size_t>(n));
}

}  // namespace dopt::optim::detail
