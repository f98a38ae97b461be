#include "dopt/gpu/device.hpp"

#include <mutex>

#include "caching_pool.hpp"
#include "cuda_util.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::gpu {
namespace detail {
void register_nccl_plane();     // nccl_plane.cpp
void register_fused_stepper();  // fused.cpp
}

namespace {

using detail::check;

void* raw_cuda_alloc(std::size_t nbytes, int device) {
  detail::DeviceGuard dg(device);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, nbytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  check(err, "cudaMalloc");
  return p;
}

void raw_cuda_free(void* p, int device) {
  detail::DeviceGuard dg(device);
  cudaFree(p);
}

// The Allocator the runtime calls for Device::cuda(i) tensors. Copies and
// fills run on the legacy default stream and wait for it, so they are
// complete (DMA included) when they return.
class CudaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t nbytes, Device device) override { return pool_.allocate(nbytes, device.index); }
  void deallocate(void* ptr, std::size_t nbytes, Device device) noexcept override {
    pool_.deallocate(ptr, nbytes, device.index);
  }
  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t n) override {
    if (n == 0) return;
    detail::DeviceGuard dg(dst_dev.is_cuda() ? dst_dev.index : src_dev.index);
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cudaStreamLegacy), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
  }
  void memset_zero(void* ptr, Device device, std::size_t n) override {
    if (n == 0) return;
    detail::DeviceGuard dg(device.index);
    check(cudaMemsetAsync(ptr, 0, n, cudaStreamLegacy), "cudaMemsetAsync");
    check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
  }

  detail::CachingPool& pool() { return pool_; }

 private:
  detail::CachingPool pool_{raw_cuda_alloc, raw_cuda_free};
};

CudaAllocator& allocator() {
  static CudaAllocator* a = new CudaAllocator();  // lives until exit; tensors may outlive statics
  return *a;
}

}  // namespace

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" / "no device" error
    return 0;
  }
  return n;
}

bool init() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_allocator(DeviceType::CUDA, &allocator());
    detail::register_nccl_plane();
    detail::register_fused_stepper();
    void register_ddp_ops(); register_ddp_ops();  // ddp_ops.cpp: reducer / comm hook / averager device ops
  });
  return device_count() > 0;
}

unsigned long long cached_bytes(int device) noexcept {
  const auto c = allocator().pool().counts(device);
  return c.in_use + c.cached;
}

unsigned long long in_use_bytes(int device) noexcept { return allocator().pool().counts(device).in_use; }

void empty_cache() { allocator().pool().release(); }

}  // namespace dopt::gpu
