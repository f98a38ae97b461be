#pragma once
// What a data-parallel training loop needs beside its optimizer, so that it
// is not written by hand (docs/trainer.md):
//   * average_gradients: every parameter's gradient becomes its mean over
//     the group's ranks (bucketed, in place), blocking or asynchronous;
//   * all_reduce_metrics: named numbers (loss, accuracy, ...) averaged or
//     summed over the ranks, for logging;
//   * CoordinatedStop: Ctrl-C (SIGINT) or SIGTERM on any rank makes every
//     rank stop after the same step.
//
// Contract (all three): collective calls of `group`. Every rank of the group
// calls them in the same order relative to its other collectives, from the
// thread that issues the group's collectives; each blocks until every rank
// has called it (the _async form returns a dopt::Future that completes
// then). Errors: dopt::ValueError naming the call and the rank for bad
// input on this rank; what the group's collectives raise otherwise
// (CollectiveMismatchError when ranks disagree on shapes or names,
// PeerLostError, TimeoutError).
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt {

struct AverageGradientsOptions {
  /// Gradients are reduced in buckets of at most this many bytes (torch
  /// DDP's bucket_cap_mb default, 25 MiB); a larger gradient is a bucket of
  /// its own.
  AverageGradientsOptions& bucket_bytes(std::size_t v) {
    bucket_bytes_ = v;
    return *this;
  }
  /// The order in which the ranks' values are summed (ReduceOrder::rank:
  /// bitwise the same on every plane and world size; ::ring: gloo's order).
  AverageGradientsOptions& order(ReduceOrder v) {
    order_ = v;
    return *this;
  }
  std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }
  ReduceOrder order() const noexcept { return order_; }

 private:
  std::size_t bucket_bytes_ = std::size_t(25) << 20;
  ReduceOrder order_ = ReduceOrder::rank;
};

/// Replaces every parameter's gradient, in place, by its mean over the
/// group: each rank divides its gradient by the group's size, then the
/// results are summed (torch DDP's allreduce_hook arithmetic). Every rank
/// passes parameters of the same shapes and dtypes in the same order, each
/// with a defined floating-point gradient (ValueError naming the first that
/// has none). The gradients must not be read or written until it returns
/// (the _async form: until its future is ready).
void average_gradients(const std::vector<Tensor>& params, ProcessGroup& group,
                       const AverageGradientsOptions& options = {});
Future<void> average_gradients_async(const std::vector<Tensor>& params, ProcessGroup& group,
                                     const AverageGradientsOptions& options = {});

/// The values of every rank's `metrics`, combined by name: ReduceOp::avg
/// (the default), sum, min or max, in float64 and rank order (so every rank
/// gets the same bits). Every rank passes the same names (a rank with other
/// names makes every rank's call fail with CollectiveMismatchError naming the
/// call). Small: meant for a few numbers per step.
std::map<std::string, double> all_reduce_metrics(ProcessGroup& group, const std::map<std::string, double>& metrics,
                                                 ReduceOp op = ReduceOp::avg);

/// Stops every rank after the same step when any of them is asked to stop.
/// Each rank holds one (simulated ranks of one process share the handlers:
/// the first object installs them for `signals`, the last one puts the
/// previous handlers back) and calls should_stop() once per step at the
/// same point. A signal (or request_stop()) on any rank before its read in
/// some call makes that call return true on every rank: the ranks stop
/// after the same step. The same signal again while the first is pending
/// is handled as before this object existed (a second Ctrl-C ends the
/// process).
class CoordinatedStop {
 public:
  explicit CoordinatedStop(std::vector<int> signals = {SIGINT, SIGTERM});
  ~CoordinatedStop();
  CoordinatedStop(const CoordinatedStop&) = delete;
  CoordinatedStop& operator=(const CoordinatedStop&) = delete;

  /// Collective over `group` (one all_reduce of one number): true on every
  /// rank when some rank was asked to stop.
  bool should_stop(ProcessGroup& group);
  /// Asks this rank to stop (as a signal would).
  void request_stop() noexcept;
  /// The first signal this process got (0: none; -1: request_stop()).
  int signal() const noexcept;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

}  // namespace dopt
