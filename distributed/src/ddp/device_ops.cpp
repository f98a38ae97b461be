#include "dopt/distributed/internal/device_ops.hpp"

#include <string>

#include "dopt/runtime/internal/device_registry.hpp"

#include "plsgd_util.hpp"

namespace dopt::optim::detail {
namespace {
dopt::detail::DeviceRegistry<DeviceOps> g_ops;
}  // namespace

void register_device_ops(DeviceType type, DeviceOps* ops) {
  g_ops.set(type, ops, "register_device_ops", "CPU tensors always use the host loops");
}

DeviceOps* device_ops_for(const Tensor& t) noexcept { return g_ops.find(t); }

void divide_any_(const Tensor& t, std::int64_t n, const char* op) {
  check_defined(t, op, "tensor");
  if (t.device().is_cpu()) {
    divide_(t, n, op);
    return;
  }
  if (!is_floating_point(t.dtype())) throw TypeError(op, "expected a floating-point tensor, got " + t.str());
  if (t.numel() == 0) return;
  if (DeviceOps* ops = device_ops_for(t)) {
    ops->divide_(t, n);
    return;
  }
  Tensor host = t.to(Device::cpu());
  divide_(host, n, op);
  t.copy_(host);
}

void convert_any_(const Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy_", "destination");
  check_defined(src, "copy_", "source");
  if (!dst.device().is_cpu() && dst.device() == src.device() && dst.dtype() != src.dtype() &&
      is_floating_point(dst.dtype()) && is_floating_point(src.dtype()) && dst.numel() == src.numel()) {
    if (DeviceOps* ops = device_ops_for(dst)) {
      if (dst.numel()) ops->convert(dst, src);
      return;
    }
  }
  dst.copy_(src);
}

}  // namespace dopt::optim::detail
