#pragma once
// Buckets (parameters_as_bucket_view): one flat buffer per kind (device,
// dtype) and rank; the trainable parameters become views of their owner's
// buffer, so a shard is broadcast in one call per kind. Rank thread only.
#include <functional>
#include <utility>
#include <vector>

#include "zero_partition.hpp"
#include "zero_repoint.hpp"

namespace dopt::optim::zero_detail {

/// A bucket kind: the parameters' device and dtype.
using Kind = std::pair<Device, DType>;

class Buckets {
 public:
  /// Where this rank's bucket of kind k lives: undefined for fresh memory
  /// (host-memory redundancy gives its shared segment's).
  using OwnBucket = std::function<Tensor(std::size_t kind)>;

  /// The kinds of every parameter of the partition, in order of first
  /// appearance over ranks, groups, parameters (the kind index of a bucket).
  static std::vector<Kind> kinds(const Partition& part);
  /// Kind index of p in `kinds`, appended when new.
  static std::size_t kind_index(std::vector<Kind>& kinds, const Tensor& p);

  /// Every rank's buckets anew for `part`: trainable parameters are copied
  /// into their owner's bucket and re-pointed at it; frozen ones get memory
  /// of their own (outside any bucket).
  void build(const Partition& part, int rank, const Repoint& repoint, const OwnBucket& own = nullptr);
  /// After a recovery: rows of survivors renumbered (old rank o's bucket at
  /// new_rank[o]), plus one row per kind of `moved` ([rank][kind] -> the
  /// parameters a survivor took over), filled and re-pointed.
  void keep_and_add(const std::vector<int>& new_rank, int world, const std::vector<Kind>& kinds,
                    const std::vector<std::vector<std::vector<Tensor>>>& moved, int rank, const Repoint& repoint,
                    const OwnBucket& own);

  /// [row][rank]: the flat buffers.
  const std::vector<std::vector<Tensor>>& rows() const noexcept { return rows_; }
  std::size_t size() const noexcept { return rows_.size(); }

 private:
  std::vector<std::vector<Tensor>> rows_;
};

}  // namespace dopt::optim::zero_detail
