#pragma once
// Internal to dopt_gpu: small kernels for the GPU tests and benchmarks (no
// CUDA types here). `stream` is a cudaStream_t.
#include <cstdint>

namespace dopt::gpu::detail {

/// One block spins for about `spin_ns` nanoseconds (globaltimer), then the grid writes value to dst[0..n).
void launch_delay_then_fill(void* stream, float* dst, std::int64_t n, float value, std::int64_t spin_ns);
/// dst[i] = src[i] + add.
void launch_add(void* stream, float* dst, const float* src, std::int64_t n, float add);
/// dst[i] = src[i] for 16-byte words (the device copy bandwidth kernel); n16 = bytes / 16.
void launch_copy16(void* stream, void* dst, const void* src, std::int64_t n16);

}  // namespace dopt::gpu::detail
