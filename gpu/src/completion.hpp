#pragma once
// Internal to dopt_gpu: the completion thread, which turns finished GPU work
// into filled futures (no CUDA types here, so its logic is tested on
// machines without a GPU with a fake probe).
//
// One thread per process, started by the first watch(). It polls every
// pending watch about every 20 microseconds and sleeps on a condition
// variable while there is none. For each watch, in this order:
//   * the probe says done   -> the promise gets its value,
//   * the probe says failed -> DeviceError naming the op and the CUDA error,
//   * poll_error() returns an error -> that error,
//   * the deadline has passed -> on_timeout()'s error (TimeoutError if none),
//   * else it stays pending.
// Promises are filled outside the thread's lock, so continuations (then())
// run on the completion thread and may call watch() again; they must not
// block. A watch's `keep` tensors are released after its promise is filled.
#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/gpu/stream.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::gpu::detail {

/// What a probe reports.
enum class Probe { done, pending, failed };

struct Watch {
  /// The event recorded after the work (queried with cudaEventQuery) ...
  Event event;
  /// ... or, when set, this instead (tests); `failed` fills `probe_error` in the message.
  std::function<Probe(std::string& probe_error)> probe;
  Promise<void> promise;
  /// steady_clock deadline; time_point::max() for none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  /// Polled while the work is not done; a non-null result fails the promise
  /// (the NCCL backend reports an asynchronous communicator error here).
  std::function<std::exception_ptr()> poll_error;
  /// Called when the deadline passes first; returns the error to fail with
  /// (the NCCL backend aborts the communicator here).
  std::function<std::exception_ptr()> on_timeout;
  /// Name of the operation for error messages.
  std::string op;
  /// Tensors the work uses, released once the watch is decided.
  std::vector<Tensor> keep;
};

/// Hands a watch to the completion thread (started on first use). Never blocks.
void watch(Watch w);

}  // namespace dopt::gpu::detail
