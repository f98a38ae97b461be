#pragma once
// Internal to dopt_gpu: CUDA error checks, the device guard and the
// completion thread that turns recorded events into filled futures.
#include <cuda_runtime_api.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "completion.hpp"
#include "dopt/actors/future.hpp"
#include "dopt/gpu/stream.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt::gpu::detail {

/// Throws DeviceError "op: <cuda error name>: <string>" for a failed call.
inline void check(cudaError_t err, const char* op) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear non-sticky errors
    throw DeviceError(op, std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err));
  }
}

/// Switches the calling thread's current device while it lives.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

cudaStream_t native(Stream& s);

/// Holds `tensors` until the work enqueued on `stream` so far has finished, so
/// that the caching allocator cannot hand their memory to anyone else while a
/// kernel or copy still uses it (a handle dropped early by the caller is safe).
void keep_until_done(Stream& stream, std::vector<Tensor> tensors, const char* op);

/// Blocks the calling thread until the work recorded before `event` has
/// finished (cudaEventSynchronize); DeviceError naming `op` when it failed.
/// Needs no completion thread, so it is safe inside a continuation.
void wait_for_event(const Event& event, const char* op);

}  // namespace dopt::gpu::detail
