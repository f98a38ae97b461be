// Small kernels for the GPU tests and benchmarks (test_kernels.hpp).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "test_kernels.hpp"

namespace dopt::gpu::detail {
namespace {

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void delay_then_fill(float* dst, long long n, float value, long long spin_ns) {
  // Every block waits, so no element is written before the delay has passed.
  const unsigned long long start = globaltimer();
  while (globaltimer() - start < static_cast<unsigned long long>(spin_ns)) {
  }
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    dst[i] = value;
}

__global__ void add_kernel(float* dst, const float* src, long long n, float add) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    dst[i] = src[i] + add;
}

__global__ void copy16_kernel(int4* dst, const int4* src, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

int blocks_for(long long n, int threads) {
  long long b = (n + threads - 1) / threads;
  if (b > 4096) b = 4096;
  return b < 1 ? 1 : static_cast<int>(b);
}

}  // namespace

void launch_delay_then_fill(void* stream, float* dst, std::int64_t n, float value, std::int64_t spin_ns) {
  delay_then_fill<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, n, value, spin_ns);
  check_launch("delay_then_fill");
}

void launch_add(void* stream, float* dst, const float* src, std::int64_t n, float add) {
  add_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, n, add);
  check_launch("add_kernel");
}

void launch_copy16(void* stream, void* dst, const void* src, std::int64_t n16) {
  copy16_kernel<<<blocks_for(n16, 512), 512, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<int4*>(dst), static_cast<const int4*>(src), n16);
  check_launch("copy16_kernel");
}

}  // namespace dopt::gpu::detail
