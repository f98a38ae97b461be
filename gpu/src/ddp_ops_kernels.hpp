#pragma once
// Internal to dopt_gpu: launchers of the DDP device ops' kernels (no CUDA
// types here). `stream` is a cudaStream_t; codes are dopt::DType values
// (float32, float64, float16, bfloat16). They only enqueue and throw
// std::runtime_error when the launch fails.
#include <cstdint>

namespace dopt::gpu::detail {

/// p[i] /= n for i < count (ddp_ops_math.hpp divide_at).
void launch_ddp_divide(void* stream, void* p, int code, std::int64_t count, std::int64_t n);
/// dst[i] = src[i] converted (ddp_ops_math.hpp convert_at).
void launch_ddp_convert(void* stream, void* dst, int dst_code, const void* src, int src_code, std::int64_t count);

}  // namespace dopt::gpu::detail
