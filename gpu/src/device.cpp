#include "dopt/gpu/device.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

#include "dopt/runtime/tensor.hpp"

namespace dopt::gpu {
namespace {

void check(cudaError_t err, const char* op) {
  if (err != cudaSuccess) throw Error(op, cudaGetErrorString(err));
}

// Caching allocator: freed blocks are kept per (device, size) and reused.
// Synchronous semantics for now: copies use cudaMemcpy (default stream).
class CudaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t nbytes, Device device) override {
    if (nbytes == 0) return nullptr;
    const std::size_t rounded = (nbytes + 511) / 512 * 512;
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto& pool = free_[{device.index, rounded}];
      if (!pool.empty()) {
        void* p = pool.back();
        pool.pop_back();
        return p;
      }
    }
    int prev = 0;
    check(cudaGetDevice(&prev), "cudaGetDevice");
    check(cudaSetDevice(device.index), "cudaSetDevice");
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err == cudaErrorMemoryAllocation) {
      release_all();
      err = cudaMalloc(&p, rounded);
    }
    cudaSetDevice(prev);
    check(err, "cudaMalloc");
    std::lock_guard<std::mutex> g(mutex_);
    held_[device.index] += rounded;
    return p;
  }
  void deallocate(void* ptr, std::size_t nbytes, Device device) noexcept override {
    if (!ptr) return;
    const std::size_t rounded = (nbytes + 511) / 512 * 512;
    std::lock_guard<std::mutex> g(mutex_);
    free_[{device.index, rounded}].push_back(ptr);
  }
  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t n) override {
    if (n == 0) return;
    cudaMemcpyKind kind = dst_dev.is_cuda() ? (src_dev.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                            : cudaMemcpyDeviceToHost;
    check(cudaMemcpy(dst, src, n, kind), "cudaMemcpy");
  }
  void memset_zero(void* ptr, Device, std::size_t n) override { check(cudaMemset(ptr, 0, n), "cudaMemset"); }

  unsigned long long held(int device) {
    std::lock_guard<std::mutex> g(mutex_);
    return held_[device];
  }
  void release_all() {
    std::lock_guard<std::mutex> g(mutex_);
    for (auto& [key, blocks] : free_) {
      for (void* p : blocks) cudaFree(p);
      held_[key.first] -= key.second * blocks.size();
      blocks.clear();
    }
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, std::size_t>, std::vector<void*>> free_;
  std::map<int, unsigned long long> held_;
};

CudaAllocator& allocator() {
  static CudaAllocator* a = new CudaAllocator();  // lives until exit; tensors may outlive statics
  return *a;
}

}  // namespace

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

bool init() {
  static std::once_flag once;
  std::call_once(once, [] { register_allocator(DeviceType::CUDA, &allocator()); });
  return device_count() > 0;
}

unsigned long long cached_bytes(int device) noexcept { return allocator().held(device); }

void empty_cache() { allocator().release_all(); }

}  // namespace dopt::gpu
