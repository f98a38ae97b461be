#pragma once
// Per-actor CUDA streams and completion futures.
//
// The stream contract (docs/gpu.md):
//  * Every actor that issues GPU work owns one Stream per device it uses: each
//    rank actor's is rank_stream(global_rank, device); a parameter-owner actor
//    (or any other actor) makes its own with make_stream(device) and keeps it.
//    All of that actor's kernels and copies are enqueued on it, so they run
//    in the order the actor issued them, and work of different actors
//    (different streams) overlaps on the device. NCCL collectives run on
//    their communicator's own stream, which first waits for the calling
//    thread's current_stream() (dopt/gpu/nccl.hpp).
//  * Nobody blocks in a synchronize on an actor thread. Completion comes back
//    as a dopt::Future<void> (completion()): an event is recorded on the
//    stream and the gpu completion thread polls it (cudaEventQuery), then
//    has the future filled. Continuations registered with then() run on the
//    gpu completion dispatcher; they may enqueue more GPU work (they are not
//    CUDA host callbacks, so CUDA calls are allowed there) and should not
//    block. One that does (Optimizer::step, a blocking collective, get() on
//    another GPU future) does not deadlock nor hold back the other futures
//    for more than about a millisecond: a fresh dispatcher takes over.
//  * Cross-stream dependencies are explicit: the producer records an Event
//    (record()), the consumer's stream waits for it (wait(event)). The wait
//    is enqueued on the device (cudaStreamWaitEvent): the host never blocks,
//    and the consumer's later kernels start only after the producer's work
//    recorded before the event has finished.
//  * The GPU operations of dopt/gpu (copy_async, zero_async, fused_step, NCCL
//    collectives) hold their tensors' storages until the stream has passed
//    them, so neither dropping a handle early nor re-pointing a tensor with
//    set_data() lets the caching allocator hand the memory to someone else
//    while a kernel still uses it. What they do
//    not do is order other access: do not read (to(), copy_(), at()) or write
//    a tensor that queued work writes until that work's completion future is
//    ready (or another stream waits on an event recorded after it).
//  * Tensor-level copies and fills (Tensor::to, copy_, zeros on a CUDA
//    device) are synchronous and complete when they return, so work enqueued
//    afterwards on any stream sees their results.
//
// This header has no CUDA types: streams and events are opaque handles.
#include <chrono>
#include <cstdint>
#include <memory>

#include "dopt/actors/future.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::gpu {

/// A recorded point in a stream's work (a pooled cudaEvent_t). Copies share
/// the event; it returns to its device's pool when the last copy goes.
class Event {
 public:
  /// The pooled event (defined by the gpu sources, which make events).
  struct Impl;

  Event() = default;
  bool valid() const noexcept { return impl_ != nullptr; }
  int device() const;
  /// Whether the work recorded before the event has finished (never blocks).
  bool query() const;
  /// cudaEvent_t, as void*.
  void* native() const;

  explicit Event(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

class Stream {
 public:
  /// A new non-blocking stream on device (does not synchronise with the legacy default stream).
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device() const noexcept;
  /// cudaStream_t, as void*.
  void* native() const noexcept;

  /// Records an event after everything enqueued so far.
  Event record();
  /// Work enqueued on this stream after this call waits (on the device) for `event`.
  void wait(const Event& event);
  /// Filled once everything enqueued so far has finished; with an error (DeviceError
  /// naming the CUDA error) when the work failed, or TimeoutError when `timeout`
  /// (0: none) passes first. Never blocks the caller.
  Future<void> completion(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  /// Blocks the calling thread until the stream is idle. For tests and tools only:
  /// never call it on an actor thread.
  void synchronize();

  /// dst <- src, enqueued on this stream (same dtype and numel; either side may be
  /// CPU). Host memory that is not pinned makes CUDA stage the copy, so the call
  /// can return before or after the transfer; do not touch src/dst until
  /// completion() (their storages are held until then).
  void copy_async(const Tensor& dst, const Tensor& src);
  /// tensor <- 0, enqueued on this stream.
  void zero_async(const Tensor& tensor);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The stream owned by the rank actor of `global_rank` on `device`: created on
/// first use, lives until the process exits. Simulated ranks in one process
/// get distinct streams, so their work overlaps.
Stream& rank_stream(int global_rank, int device);
/// A stream for another actor (a parameter owner): the caller owns it.
std::unique_ptr<Stream> make_stream(int device);

/// The calling thread's current stream for device: the one set by the
/// innermost StreamGuard, else this thread's own stream (one per thread and
/// device, created on first use), so two threads never share a stream by
/// accident.
Stream& current_stream(int device);

/// Makes `stream` the calling thread's current stream for its device while it lives.
class StreamGuard {
 public:
  explicit StreamGuard(Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream* previous_;
  int device_;
};

}  // namespace dopt::gpu
