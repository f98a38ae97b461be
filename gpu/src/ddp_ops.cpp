// dopt::optim::detail::DeviceOps for CUDA tensors (registered by gpu::init()):
// the division and the dtype conversions of the reducer, the comm hooks and
// the model averagers, as kernels (ddp_ops_kernels.cu). Like the allocator's
// copies they run on the legacy default stream and wait for it, so the
// values are in place when they return (the caller then hands the tensor to
// an NCCL collective on the rank's stream, or copies it).
#include <stdexcept>
#include <string>

#include "cuda_util.hpp"
#include "ddp_ops_kernels.hpp"
#include "dopt/distributed/internal/device_ops.hpp"

namespace dopt::gpu {
namespace {

int code_of(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::float32:
    case DType::float64:
    case DType::float16:
    case DType::bfloat16:
      return static_cast<int>(t.dtype());
    default:
      throw TypeError(op, "expected a floating-point tensor, got " + t.str());
  }
}

class CudaDdpOps final : public optim::detail::DeviceOps {
 public:
  void divide_(const Tensor& t, std::int64_t n) override {
    static constexpr const char* op = "DeviceOps.divide_";
    const int code = code_of(t, op);
    if (t.numel() == 0) return;
    detail::DeviceGuard dg(t.device().index);
    run(op, [&] { detail::launch_ddp_divide(cudaStreamLegacy, t.data_ptr(), code, t.numel(), n); });
  }
  void convert(const Tensor& dst, const Tensor& src) override {
    static constexpr const char* op = "DeviceOps.convert";
    const int dc = code_of(dst, op), sc = code_of(src, op);
    check_same_device(dst, src, op);
    if (dst.numel() != src.numel())
      throw ShapeError(op, "cannot convert " + src.str() + " into " + dst.str());
    if (dst.numel() == 0) return;
    detail::DeviceGuard dg(dst.device().index);
    run(op, [&] {
      detail::launch_ddp_convert(cudaStreamLegacy, dst.data_ptr(), dc, src.data_ptr(), sc, dst.numel());
    });
  }

 private:
  template <class F>
  static void run(const char* op, F&& launch) {
    try {
      launch();
    } catch (const std::runtime_error& e) {
      throw DeviceError(op, e.what());
    }
    detail::check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
  }
};

}  // namespace

/// Called once by gpu::init().
void register_ddp_ops() {
  static CudaDdpOps* ops = new CudaDdpOps();  // lives until exit
  optim::detail::register_device_ops(DeviceType::CUDA, ops);
}

}  // namespace dopt::gpu
