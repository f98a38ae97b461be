#pragma once
// Partition: which rank owns which parameter (ZeRO stage 1 assigns whole
// parameters). Values: every rank computes the same one from the same
// inputs; ZeroCore holds the current one and replaces it whole (a new group,
// the overlap plan, a recovery). It holds the parts of the ranks that own
// something, not one per rank of the world: at most one per parameter (so
// that thousands of simulated ranks in one process do not each hold one
// part per rank).
#include <cstdint>
#include <memory>
#include <utility>
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

  int world() const noexcept { return world_; }
  /// [rank][group] -> parameters, in assignment order: every rank's part,
  /// made when first asked (O(world); the public partition(), the bucket
  /// view). Not concurrently with itself on one Partition.
  const std::vector<std::vector<std::vector<Tensor>>>& by_rank() const;
  /// Rank r's part: [group] -> parameters (every group empty when it owns nothing).
  const std::vector<std::vector<Tensor>>& of(int r) const;
  /// The ranks that own a parameter, ascending (at most one per parameter).
  std::vector<int> owning_ranks() const;
  /// Rank r's parameters in partition order (groups, then assignment).
  std::vector<Tensor> shard(int r) const;
  /// Owner of each parameter, by global index (-1: none).
  const std::vector<int>& owners() const noexcept { return owner_; }
  int owner(std::size_t i) const { return owner_[i]; }
  /// Rank r's part of groups [first, end) with copies of the global options.
  std::vector<OptimizerParamGroup> local_groups(const ZeroParams& params, int r, std::size_t first = 0) const;

 private:
  int world_ = 0;
  std::vector<std::vector<Tensor>> none_;  // [group] -> nothing: a rank's part before it owns anything
  std::vector<std::pair<int, std::vector<std::vector<Tensor>>>> owning_;  // (rank, part), by rank
  std::vector<int> owner_;
  mutable std::shared_ptr<const std::vector<std::vector<std::vector<Tensor>>>> by_rank_;  // once made
};

}  // namespace dopt::optim::zero_detail
