#pragma once
// ZeroOverlap: the overlap_with_ddp driver of one ZeroRedundancyOptimizer
// (contract: dopt/distributed/zero_overlap.hpp). It owns what it needs (the
// plan, the worker, the functional optimizer) and reaches the optimizer only
// through OverlapHost. Not installed.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/distributed/zero.hpp"
#include "zero_params.hpp"
#include "zero_partition.hpp"
#include "zero_repoint.hpp"

namespace dopt::optim {

class Reducer;

namespace zero_detail {

/// What ZeroOverlap may do to its optimizer (ZeroCore implements it).
class OverlapHost {
 public:
  /// Rank thread, once, in plan(): the partition follows the plan (each
  /// bucket's parameters to its owner) and the local optimizer is made anew
  /// over this rank's part, with the global hyperparameters.
  virtual void adopt_plan(Partition part) = 0;
  /// Rank thread, bucket 0 of an iteration: Join::notify_join_context of the
  /// ZeroRedundancyOptimizer; its future is waited for by the worker.
  virtual Future<void> notify_join() = 0;
  /// The global hyperparameters of every group (rank thread, bucket 0).
  virtual std::vector<Hyperparams> hyperparams() const = 0;
  /// Exchanges the local optimizer's state with `state`: at bucket 0 (rank
  /// thread) the worker borrows it, at the end of the iteration (worker, or
  /// the destructor) it goes back. Called under ZeroOverlap's mutex; no
  /// other thread touches the local optimizer's state in between.
  virtual void swap_local_state(std::unordered_map<const TensorImpl*, ParamState>& state) = 0;
  /// Worker thread, under ZeroOverlap's mutex: an overlapped iteration
  /// completed (step_count() counts it; the rank thread reads it after
  /// wait_step()).
  virtual void count_overlapped_step() = 0;

 protected:
  ~OverlapHost() = default;
};

class ZeroOverlap {
 public:
  /// `group`: ZeRO's (the plan's agreement); `params` and `repoint` outlive
  /// this (ZeroCore's; params do not change with overlap: add_param_group
  /// is refused).
  ZeroOverlap(OverlapHost& host, const ZeroParams& params, const Repoint& repoint, ProcessGroup group,
              ProcessGroup broadcast_group, std::unique_ptr<FunctionalOptimizer> f);
  /// Stops the worker; fails the futures of an unfinished iteration.
  ~ZeroOverlap();
  ZeroOverlap(const ZeroOverlap&) = delete;
  ZeroOverlap& operator=(const ZeroOverlap&) = delete;

  /// Makes (or, when made already, checks) the plan from the reducer's
  /// buckets; a collective over ZeRO's group. Rank thread, between iterations.
  void plan(const Reducer& reducer, const char* op);
  /// Rank thread, bucket 0 only, before the inner hook runs: Join notify,
  /// hyperparameter snapshot, state to the functional optimizer.
  void begin_iteration();
  /// Rank thread: hands bucket b's reduction to the worker; returns the
  /// future the reducer waits for.
  Future<Tensor> on_bucket(const GradBucket& bucket, Future<Tensor> reduced, bool interleaved);
  /// ZeRO's step(): waits for the iteration in flight, rethrows its error.
  void wait_step();
  void require_idle(const std::string& op) const;
  std::vector<int> bucket_owners() const;

 private:
  struct Bucket {
    std::vector<Tensor> params;       // reducer order
    std::vector<std::int64_t> offsets;
    std::vector<std::size_t> group;   // ZeRO group of each param
    std::int64_t numel = 0;
    DType dtype = DType::float32;
    Device device;                    // the params' device (the reducer's buckets are single-device)
    int owner = -1;
    Tensor flat;                      // the params' storage, on their device; what is broadcast
  };
  struct Task {
    Future<Tensor> reduced;
    Promise<Tensor> done;
  };

  void run();
  /// Owner's update of bucket b from its reduced buffer.
  void step_bucket(std::size_t b, const Tensor& reduced);
  /// Fails the promises of tasks [from, end) of the current iteration (under mutex_).
  void fail_tasks_locked(std::size_t from, std::exception_ptr e);

  OverlapHost& host_;
  const ZeroParams& params_;
  const Repoint& repoint_;
  ProcessGroup group_;
  int rank_ = 0;
  ProcessGroup bgroup_;
  std::unique_ptr<FunctionalOptimizer> fopt_;
  std::vector<Bucket> buckets_;
  bool planned_ = false;

  mutable std::mutex mutex_;
  std::condition_variable cv_;     // worker: new tasks / stop
  std::condition_variable idle_;   // step(): iteration done
  std::vector<Task> tasks_;        // this iteration's, by bucket index
  bool interleaved_ = true;
  bool in_flight_ = false;
  bool stop_ = false;
  std::exception_ptr last_error_;
  std::vector<Hyperparams> hyper_;  // per group, snapshot at bucket 0
  std::size_t current_group_ = static_cast<std::size_t>(-1);
  Future<void> notify_;
  std::thread worker_;
};

}  // namespace zero_detail
}  // namespace dopt::optim
