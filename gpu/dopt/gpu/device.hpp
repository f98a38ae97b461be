#pragma once
// CUDA devices for dopt::Tensor. Linking dopt_gpu and calling init() (once,
// from any thread; later calls are no-ops) registers the CUDA allocator with
// the runtime, after which Tensor::empty(..., Device::cuda(i)) allocates with
// cudaMalloc through a per-device caching pool (no managed memory), and
// copy_() moves bytes between host and device.
namespace dopt::gpu {

/// Number of CUDA devices visible (0 when there is no driver or no device).
int device_count() noexcept;
/// Registers the CUDA allocator; returns whether at least one device is usable.
bool init();
/// Bytes currently held by the caching allocator on device (allocated + cached).
unsigned long long cached_bytes(int device) noexcept;
/// Returns cached, unused blocks to the driver.
void empty_cache();

}  // namespace dopt::gpu
