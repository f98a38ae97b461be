// The DDP device ops' kernels (ddp_ops_kernels.hpp): one grid-stride pass,
// the arithmetic of ddp_ops_math.hpp (built with --fmad=false, IEEE division).
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ddp_ops_kernels.hpp"
#include "ddp_ops_math.hpp"

namespace dopt::gpu::detail {
namespace {

constexpr int kThreads = 256;

__global__ void ddp_divide_kernel(void* p, int code, long long count, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    ddp::divide_at(p, code, i, n);
}

__global__ void ddp_convert_kernel(void* dst, int dc, const void* src, int sc, long long count) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    ddp::convert_at(dst, dc, src, sc, i);
}

unsigned blocks_for(std::int64_t count) {
  return static_cast<unsigned>(std::clamp<std::int64_t>((count + kThreads - 1) / kThreads, 1, 8192));
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

void launch_ddp_divide(void* stream, void* p, int code, std::int64_t count, std::int64_t n) {
  if (count <= 0) return;
  ddp_divide_kernel<<<blocks_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, code, count, n);
  check_launch("ddp divide kernel");
}

void launch_ddp_convert(void* stream, void* dst, int dst_code, const void* src, int src_code, std::int64_t count) {
  if (count <= 0) return;
  ddp_convert_kernel<<<blocks_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(dst, dst_code, src,
                                                                                            src_code, count);
  check_launch("ddp convert kernel");
}

}  // namespace dopt::gpu::detail
