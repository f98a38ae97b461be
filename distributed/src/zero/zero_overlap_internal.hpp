#pragma once
// ZeroOverlap: the overlap_with_ddp machinery of one ZeroRedundancyOptimizer
// (contract: dopt/distributed/zero_overlap.hpp). Private to dopt_optim.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/distributed/zero.hpp"

namespace dopt::optim {

class Reducer;

class ZeroOverlap {
 public:
  ZeroOverlap(ZeroRedundancyOptimizer& zero, ProcessGroup broadcast_group, std::unique_ptr<FunctionalOptimizer> f);
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

  ZeroRedundancyOptimizer& zero_;
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

struct ZeroOverlapAccess {
  static std::shared_ptr<ZeroOverlap> engine(ZeroRedundancyOptimizer& z) { return z.overlap_; }
};

}  // namespace dopt::optim
