#pragma once
// dopt <-> libtorch (torch's C++ frontend), without copies.
//
//   torch::nn::Sequential net(...);
//   dopt::libtorch::ParameterBinding bind(net->parameters());   // dopt tensors over the parameters' memory
//   dopt::optim::ZeroOptions zo{world, /*parameters_as_bucket_view=*/true};
//   zo.rebind_parameter = bind.rebind_hook();                   // torch parameters follow into the buckets
//   dopt::optim::ZeroRedundancyOptimizer zero(bind.params(), {"Adam", {{"lr", 1e-3}}}, zo);
//   for (...) {
//     net->zero_grad(); loss.backward();
//     bind.sync();                                              // torch's (re-)allocated grads -> dopt grads
//     zero.step();                                              // updates the torch parameters in place
//   }
//
// Memory. to_dopt(t) is a dopt tensor over t's memory that keeps that
// memory alive (it holds a detached alias of t, so a later `t.set_data(...)`
// does not free what dopt points at); to_torch(d) is a torch tensor over d's
// memory that keeps d's storage alive. Only dense, contiguous (row-major)
// tensors can be shared (ValueError otherwise). dtypes: float32, float64,
// float16, bfloat16, int8, uint8, int32, int64 (bool cannot cross).
//
// Parameters. ParameterBinding holds, for each torch parameter, a dopt tensor
// over its memory; give params() to any dopt optimizer, ZeRO or the
// Reducer: they update the torch parameters in place. Wherever dopt
// re-points a parameter at memory it owns (ZeRO's parameters_as_bucket_view
// or overlap_with_ddp, see zero.hpp), rebind_hook() re-points the torch
// parameter too (`p.set_data(view)`, torch's `p.data = bucket_view`), so the
// model keeps seeing every update; without it ZeRO refuses these
// parameters. Gradients: torch allocates p.grad() in the first backward and
// again after zero_grad(set_to_none=true); sync() (call it after backward,
// before the reducer or the step) gives each dopt parameter a gradient over
// the current p.grad() memory (undefined when p has none), re-points a dopt
// parameter whose torch parameter was given new memory, and copies
// requires_grad. It re-binds only what changed (a pointer comparison per
// parameter).
//
// Devices and streams. CPU and CUDA tensors cross the same way (a CUDA
// tensor becomes a dopt tensor on Device::cuda(index), which needs dopt's
// gpu/ component at run time for any operation). torch enqueues its kernels
// on its current stream, dopt on its own streams (docs/gpu.md); neither
// waits for the other's. The hand-off: sync() waits for the work torch queued
// on the parameters' devices (torch::cuda::synchronize), so dopt reads the
// finished gradients; dopt's blocking calls (step(), the blocking
// collectives, Reducer::finalize()) return when their device work is done,
// so torch's later kernels see the updated parameters. With the async dopt
// calls, wait for their futures before torch touches those tensors.
//
// Threads: a binding is used by one thread at a time (the rank's).
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include <ATen/Tensor.h>

#include "dopt/runtime/tensor.hpp"

namespace dopt::libtorch {

/// A dopt tensor over t's memory (no copy); requires_grad copied from t.
/// ValueError for a non-contiguous or sparse tensor, DTypeError for bool
/// or complex, DeviceError for a device other than CPU or CUDA.
Tensor to_dopt(const at::Tensor& t);
/// A torch tensor over d's memory (no copy), on d's device.
at::Tensor to_torch(const Tensor& d);

class ParameterBinding {
 public:
  /// Binds every tensor of params (e.g. module->parameters()); duplicates
  /// (the same tensor twice) are bound once.
  explicit ParameterBinding(std::vector<at::Tensor> params);

  /// The dopt tensors, one per torch parameter, in order.
  const std::vector<Tensor>& params() const noexcept { return dopt_; }
  /// The torch parameters, in the same order.
  const std::vector<at::Tensor>& torch_params() const noexcept { return torch_; }
  /// The torch parameter of a dopt parameter (ValueError when not bound here).
  const at::Tensor& torch_param(const Tensor& p) const;

  /// Carries over what torch changed since the last call (see the header).
  void sync();
  /// For ZeroOptions::rebind_parameter: re-points the torch parameter of the
  /// dopt parameter it gets at that parameter's (new) memory. The hook refers
  /// to this binding: keep the binding alive as long as the optimizer.
  std::function<void(const Tensor&)> rebind_hook();

 private:
  std::size_t index_of(const Tensor& p, const char* op) const;
  void rebind(const Tensor& p);

  std::vector<at::Tensor> torch_;
  std::vector<Tensor> dopt_;
  std::vector<const void*> data_;  // torch parameter memory last bound
  std::vector<const void*> grad_;  // torch gradient memory last bound (null: none)
  std::unordered_map<const TensorImpl*, std::size_t> index_;
};

}  // namespace dopt::libtorch
