#pragma once
// dopt::optim::detail::DeviceOps: the hook through which an optional
// component (gpu/: two small CUDA kernels) runs the element-wise operations
// of the reducer, the comm hooks and the model averagers on tensors that do
// not live on the CPU, so that Reducer, allreduce_hook, fp16/bf16_compress_hook,
// post_localSGD_hook, average_parameters, the model averagers and
// PostLocalSGDOptimizer work on device tensors unchanged.
//
// The operations must give the CPU path's values bit for bit:
//  * divide_(t, n): t[i] / n in place. float32 and float64 divide in their own
//    type by n converted to it (IEEE, round to nearest); float16 and bfloat16
//    widen to float32, divide by float(n) in float32 and round back to nearest
//    even (runtime's float_to_half / float_to_bfloat16: NaN -> sign | 0x7e00
//    for float16, (bits >> 16) | 0x40 for bfloat16).
//  * convert(dst, src): Tensor::copy_'s CPU conversion between the floating
//    types (float16/bfloat16 -> float32 exactly; float64 -> float16/bfloat16
//    through float32, i.e. rounded twice as on the CPU; float64 -> float32 and
//    float32 -> float64 plain casts). dst and src are on the same device, have
//    the same numel and different floating dtypes.
// Both return once the values are in place (like Tensor::copy_ on a device:
// the caller then hands the tensor to a collective on another stream, or
// reads it) and throw DeviceError when the device fails.
//
// register_device_ops is called once per device type (gpu::init()); the
// object must live until the process exits. Without ops for a device,
// divide_any_ and convert_any_ stage through host memory (see below).
#include <cstdint>

#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::detail {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual void divide_(const Tensor& t, std::int64_t n) = 0;
  virtual void convert(const Tensor& dst, const Tensor& src) = 0;
};

/// Registers (nullptr: removes) the ops for tensors on `type` (not CPU).
void register_device_ops(DeviceType type, DeviceOps* ops);
/// The ops for t's device, or nullptr (CPU, undefined, none registered).
DeviceOps* device_ops_for(const Tensor& t) noexcept;

/// t /= n in place on any device, the CPU path's arithmetic (TypeError for a
/// non-floating tensor, naming op). CPU: the host loop. A device with ops:
/// DeviceOps::divide_. A device without: a copy to host, the host loop, a
/// copy back (2 x nbytes over the bus; correct, slow).
void divide_any_(const Tensor& t, std::int64_t n, const char* op);
/// dst.copy_(src) for floating tensors (any dtypes); when both are on one
/// non-CPU device with ops and the dtypes differ, DeviceOps::convert runs on
/// the device, otherwise Tensor::copy_ (which converts on the host).
void convert_any_(const Tensor& dst, const Tensor& src);

}  // namespace dopt::optim::detail
