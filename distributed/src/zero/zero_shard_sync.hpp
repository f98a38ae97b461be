#pragma once
// ShardSync: after a step, every shard goes from its owner to every rank
// (broadcasts on ZeRO's group: per bucket with parameters_as_bucket_view,
// else one coalesced call per owner; device tensors one by one). A
// collective: every rank runs it at the same point. Rank thread; the
// future of start() completes on a runtime thread.
#include <functional>

#include "dopt/actors/process_group.hpp"
#include "zero_buckets.hpp"
#include "zero_partition.hpp"

namespace dopt::optim::zero_detail {

class ShardSync {
 public:
  /// `buckets` is read only with bucket_view.
  ShardSync(ProcessGroup& group, const Partition& part, const Buckets& buckets, bool bucket_view)
      : group_(group), part_(part), buckets_(buckets), bucket_view_(bucket_view) {}
  /// Posts every broadcast (`posted(i)` after the i-th) and returns at once:
  /// the future completes when every posted broadcast has, with the error
  /// of a failed posting, else the first broadcast error (list order).
  /// step_async() hands it to the caller; run() waits for it.
  Future<void> start(const std::function<void(int)>& posted);
  /// start(), then `meanwhile` once while the broadcasts are in flight (even
  /// when posting failed), then waits for all and rethrows meanwhile's
  /// error, else start()'s.
  void run(const std::function<void(int)>& posted, const std::function<void()>& meanwhile = nullptr);

 private:
  ProcessGroup& group_;
  const Partition& part_;
  const Buckets& buckets_;
  bool bucket_view_;
};

}  // namespace dopt::optim::zero_detail
