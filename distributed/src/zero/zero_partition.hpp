#pragma once
// Partition: which rank owns which parameter (ZeRO stage 1 assigns whole
// parameters). Values: every rank computes the same one from the same
// inputs; ZeroCore holds the current one and replaces it whole (a new group,
// the overlap plan, a recovery).
#include <cstdint>
#include <vector>

#include "dopt/optim/optimizer.hpp"
#include "zero_params.hpp"

namespace dopt::optim::zero_detail {

class Partition {
 public:
  Partition() = default;
  /// Nobody owns anything yet (overlap_with_ddp before its plan).
  static Partition none(const ZeroParams& params, int world);
  /// torch's: group by group, heaviest first (stable), each parameter to the
  /// rank with the least weight so far (the lowest on a tie).
  static Partition balanced(const ZeroParams& params, const std::vector<double>& weight, int world);
  /// After a loss (new_rank[o]: old rank o's new rank, -1 lost): every
  /// survivor keeps what it owned, in order; the lost ranks' parameters go,
  /// group by group and heaviest first, to the least loaded survivor.
  static Partition keeping(const Partition& old, const std::vector<int>& new_rank, int world,
                           const std::vector<double>& weight, const ZeroParams& params);
  /// Empty, to be filled with assign() in order (the overlap plan).
  static Partition blank(std::size_t groups, std::size_t params, int world);
  /// Appends p (global index i, group g) to rank r's part.
  void assign(const Tensor& p, std::int64_t i, std::size_t g, int r);

  int world() const noexcept { return static_cast<int>(by_rank_.size()); }
  /// [rank][group] -> parameters, in assignment order.
  const std::vector<std::vector<std::vector<Tensor>>>& by_rank() const noexcept { return by_rank_; }
  const std::vector<std::vector<Tensor>>& of(int r) const { return by_rank_[static_cast<std::size_t>(r)]; }
  /// Rank r's parameters in partition order (groups, then assignment).
  std::vector<Tensor> shard(int r) const;
  /// Owner of each parameter, by global index (-1: none).
  const std::vector<int>& owners() const noexcept { return owner_; }
  int owner(std::size_t i) const { return owner_[i]; }
  /// Rank r's part of groups [first, end) with copies of the global options.
  std::vector<OptimizerParamGroup> local_groups(const ZeroParams& params, int r, std::size_t first = 0) const;

 private:
  std::vector<std::vector<std::vector<Tensor>>> by_rank_;
  std::vector<int> owner_;
};

}  // namespace dopt::optim::zero_detail
