#pragma once
// Internal to dopt_gpu: the completion thread, which turns finished GPU work
// into filled futures (no CUDA types here, so its logic is tested on
// machines without a GPU with fake probes).
//
// Two kinds of threads, started by the first watch():
//  * The poller polls every pending watch about every 20 microseconds and
//    sleeps on a condition variable while there is none. For each watch, in
//    this order:
//      - a start event/probe that is not done yet -> pending, no deadline yet,
//      - the probe says done   -> filled with its value,
//      - the probe says failed -> DeviceError naming the op and the CUDA error,
//      - poll_error() returns an error -> that error,
//      - the deadline has passed -> on_timeout()'s error (TimeoutError if none),
//      - else it stays pending.
//  * A dispatcher fills the decided promises, in the order they were decided,
//    so continuations registered with then() run on it (they may call watch()
//    again). A continuation that blocks (a blocking collective whose NCCL
//    communicator is created on first use, Optimizer::step, a get() on
//    another GPU future) would hold back every later completion; so when the
//    dispatcher has been busy with one promise for longer than kStall while
//    others wait, the poller retires it (it ends once its continuation
//    returns) and starts a fresh dispatcher that goes on with the queue. At
//    most kMaxDispatchers run at once; beyond that, the queue waits.
// A watch's `keep` storages are released after its promise is filled.
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/gpu/stream.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::gpu::detail {

/// What a probe reports.
enum class Probe { done, pending, failed };

/// How long one continuation may block the dispatcher before the queue moves on to a new one.
inline constexpr std::chrono::microseconds kStall{1000};
/// Most dispatcher threads alive at once (each blocked continuation holds one).
inline constexpr int kMaxDispatchers = 64;

struct Watch {
  /// The event recorded after the work (queried with cudaEventQuery) ...
  Event event;
  /// ... or, when set, this instead (tests); `failed` fills `probe_error` in the message.
  std::function<Probe(std::string& probe_error)> probe;
  Promise<void> promise;
  /// steady_clock deadline; time_point::max() for none. Ignored when `timeout` is set.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  /// When positive: the work fails with on_timeout()'s error unless it is done
  /// `timeout` after it started, i.e. after the `start` event (or start_probe)
  /// completed, or after watch() when neither is set. Time spent queued
  /// behind earlier work on the stream, before `start`, does not count.
  std::chrono::steady_clock::duration timeout{0};
  /// The event recorded on the stream just before the work (see `timeout`) ...
  Event start;
  /// ... or, when set, this instead (tests).
  std::function<Probe(std::string& probe_error)> start_probe;
  /// Polled while the work is not done; a non-null result fails the promise
  /// (the NCCL backend reports an asynchronous communicator error here).
  std::function<std::exception_ptr()> poll_error;
  /// Called when the deadline passes first; returns the error to fail with
  /// (the NCCL backend aborts the communicator here).
  std::function<std::exception_ptr()> on_timeout;
  /// Name of the operation for error messages.
  std::string op;
  /// Storages the work uses, released once the watch is decided and its
  /// promise filled. Storages, not Tensor handles: a tensor re-pointed with
  /// set_data() while the work is queued must not give its old block back
  /// to the caching allocator before the work is done.
  std::vector<std::shared_ptr<Storage>> keep;
};

/// The storages behind `tensors` (undefined ones skipped), for Watch::keep.
std::vector<std::shared_ptr<Storage>> storages_of(const std::vector<Tensor>& tensors);

/// Hands a watch to the completion thread (started on first use). Never blocks.
void watch(Watch w);

/// Number of dispatcher threads started so far (tests).
int dispatchers_started() noexcept;

}  // namespace dopt::gpu::detail
