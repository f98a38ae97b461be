#pragma once
// CUDA devices for dopt::Tensor. Linking dopt_gpu and calling init() (once,
// from any thread; later calls are no-ops) registers the CUDA allocator and
// the NCCL collective backend with the runtime, after which
// Tensor::empty(..., Device::cuda(i)) allocates with cudaMalloc through a
// per-device caching pool (no managed memory), copy_() moves bytes between
// host and device, to_dlpack()/from_dlpack() exchange kDLCUDA tensors, and
// ProcessGroup collectives on CUDA tensors run on NCCL (dopt/gpu/nccl.hpp),
// and Optimizer::step / FunctionalOptimizer::step update CUDA parameters
// with the fused kernels (dopt/gpu/fused.hpp) on the calling thread's
// current stream, waiting for them before they return.
//
// Tensor-level copies and fills (copy_, zero_, fill_, to()) are synchronous:
// they return when the bytes are in place, so their results are visible to
// work enqueued afterwards on any stream. Asynchronous copies are
// Stream::copy_async (dopt/gpu/stream.hpp).
namespace dopt::gpu {

/// Number of CUDA devices visible (0 when there is no driver or no device).
int device_count() noexcept;
/// Registers the CUDA allocator, the NCCL backend and the fused-kernel stepper; returns whether at least one device is usable.
bool init();
/// Bytes currently held by the caching allocator on device (in use + cached).
unsigned long long cached_bytes(int device) noexcept;
/// Bytes handed out to live tensors on device.
unsigned long long in_use_bytes(int device) noexcept;
/// Returns cached, unused blocks to the driver.
void empty_cache();

}  // namespace dopt::gpu
