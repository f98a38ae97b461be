#include "dopt/libtorch/interop.hpp"

#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "dopt/runtime/error.hpp"

namespace dopt::libtorch {
namespace {

DType dtype_of(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::float32;
    case at::kDouble: return DType::float64;
    case at::kHalf: return DType::float16;
    case at::kBFloat16: return DType::bfloat16;
    case at::kChar: return DType::int8;
    case at::kByte: return DType::uint8;
    case at::kInt: return DType::int32;
    case at::kLong: return DType::int64;
    default:
      throw DTypeError(op, std::string("torch dtype ") + c10::toString(t.scalar_type()) + " has no dopt counterpart");
  }
}

at::ScalarType scalar_type_of(DType d) {
  switch (d) {
    case DType::float32: return at::kFloat;
    case DType::float64: return at::kDouble;
    case DType::float16: return at::kHalf;
    case DType::bfloat16: return at::kBFloat16;
    case DType::int8: return at::kChar;
    case DType::uint8: return at::kByte;
    case DType::int32: return at::kInt;
    case DType::int64: return at::kLong;
    case DType::bool_: return at::kBool;
  }
  return at::kFloat;
}

Device device_of(const at::Tensor& t, const char* op) {
  if (t.device().is_cpu()) return Device::cpu();
  if (t.device().is_cuda()) return Device::cuda(t.device().index());
  throw DeviceError(op, "torch device " + t.device().str() + " is neither CPU nor CUDA");
}

void sync_device(const at::Tensor& t) {
  if (t.device().is_cuda()) torch::cuda::synchronize(t.device().index());
}

}  // namespace

Tensor to_dopt(const at::Tensor& t) {
  constexpr const char* op = "libtorch::to_dopt";
  if (!t.defined()) throw ValueError(op, "undefined torch tensor");
  if (t.layout() != at::kStrided) throw ValueError(op, "only dense torch tensors can be shared");
  if (!t.is_contiguous())
    throw ValueError(op, "the torch tensor of shape " + c10::str(t.sizes()) + " is not contiguous (strides " +
                             c10::str(t.strides()) + "); dopt shares contiguous tensors only");
  const DType dt = dtype_of(t, op);
  const Device dev = device_of(t, op);
  // A detached alias: shares the storage, and keeps it even if `t` is later set_data'd elsewhere.
  auto alias = std::make_shared<at::Tensor>(t.detach());
  Tensor d = Tensor::from_blob(alias->data_ptr(), Shape(t.sizes().begin(), t.sizes().end()), dt, dev,
                               std::shared_ptr<void>(alias, alias.get()));
  d.set_requires_grad(t.requires_grad());
  return d;
}

at::Tensor to_torch(const Tensor& d) {
  check_defined(d, "libtorch::to_torch");
  auto storage = d.storage();  // kept alive by the torch tensor's deleter
  const Device dev = d.device();
  auto options = at::TensorOptions()
                     .dtype(scalar_type_of(d.dtype()))
                     .device(dev.is_cuda() ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(dev.index))
                                           : at::Device(at::kCPU));
  return at::from_blob(
      d.data_ptr(), at::IntArrayRef(d.shape()), [storage](void*) mutable { storage.reset(); }, options);
}

ParameterBinding::ParameterBinding(std::vector<at::Tensor> params) {
  for (auto& p : params) {
    bool seen = false;
    for (const auto& q : torch_) seen = seen || q.is_same(p);
    if (seen) continue;
    Tensor d = to_dopt(p);
    index_.emplace(d.key(), dopt_.size());
    data_.push_back(p.data_ptr());
    grad_.push_back(nullptr);
    torch_.push_back(p);
    dopt_.push_back(std::move(d));
  }
}

std::size_t ParameterBinding::index_of(const Tensor& p, const char* op) const {
  auto it = index_.find(p.key());
  if (it == index_.end()) throw ValueError(op, "the tensor " + p.str() + " is not a parameter of this binding");
  return it->second;
}

const at::Tensor& ParameterBinding::torch_param(const Tensor& p) const {
  return torch_[index_of(p, "ParameterBinding::torch_param")];
}

void ParameterBinding::sync() {
  bool waited_cuda = false;
  for (std::size_t i = 0; i < torch_.size(); ++i) {
    const at::Tensor& p = torch_[i];
    if (p.is_cuda() && !waited_cuda) {
      sync_device(p);  // torch's queued kernels (the backward) are done before dopt reads
      waited_cuda = true;
    }
    const Tensor& d = dopt_[i];
    if (p.data_ptr() != data_[i]) {  // torch (or the user) gave the parameter new memory
      Tensor fresh = to_dopt(p);
      d.set_data(fresh);
      data_[i] = p.data_ptr();
    }
    if (d.requires_grad() != p.requires_grad()) d.set_requires_grad(p.requires_grad());
    const at::Tensor& g = p.grad();
    if (!g.defined()) {
      if (grad_[i]) {
        d.set_grad(Tensor());
        grad_[i] = nullptr;
      }
    } else if (g.data_ptr() != grad_[i]) {
      Tensor dg = to_dopt(g);
      dg.set_requires_grad(false);
      d.set_grad(dg);
      grad_[i] = g.data_ptr();
    }
  }
}

void ParameterBinding::rebind(const Tensor& p) {
  const std::size_t i = index_of(p, "ParameterBinding::rebind");
  at::Tensor view = to_torch(p);
  torch_[i].set_data(view);
  data_[i] = torch_[i].data_ptr();
}

std::function<void(const Tensor&)> ParameterBinding::rebind_hook() {
  return [this](const Tensor& p) { rebind(p); };
}

}  // namespace dopt::libtorch
