#pragma once
// Fused multi-tensor optimizer steps on CUDA parameters.
//
// One call updates many parameters with few kernel launches (multi-tensor
// apply: up to 48 tensors and 1280 chunks of 32 Ki elements per launch), one
// pass over memory: each element of param, grad and state is read once and
// written once. All eight optimizers: SGD (momentum, dampening, nesterov,
// weight decay, maximize), Adam and AdamW (amsgrad), Adagrad, RMSprop
// (centered, momentum), Adamax, Adadelta, Rprop, chosen by the options' type
// (AdamOptions -> Adam, AdamWOptions -> AdamW, ...).
//
// Results: float32 and float64 parameters get bitwise the CPU path's values
// (optim/src/<opt>.cpp: same scalars computed in double and rounded once,
// same operation order, FMA exactly where the CPU path fuses), hence torch
// 1.13's single-tensor results. State has torch's layout and keys (the same
// ParamState the CPU optimizers keep; `step` a CPU 0-d tensor), so
// state_dict()/load_state_dict() work unchanged.
//
// 16-bit parameters (float16/bfloat16, which the CPU path rejects) are
// updated in float32 arithmetic. New state is in the parameter's dtype unless
// FusedOptions::fp32_state; with FusedOptions::master_weights an fp32 copy of
// the parameter is kept in state "master_param" (created from the parameter
// at its first step): the update reads and writes the master, and the
// parameter receives its rounding (nearest even). Existing state keeps its
// dtype (float32 state for a 16-bit parameter is always accepted).
//
// Streams: the kernels are enqueued on `stream` (normally the calling actor's,
// see dopt/gpu/stream.hpp); the call returns without waiting. Parameters,
// gradients and state must be ready on that stream (produced on it, or after
// stream.wait(event)), and must not be read or written elsewhere until
// stream.completion() is ready (their storages are held until the kernels are
// done, so dropping them early is safe). Step counters (CPU scalars) are
// updated on the host before the call returns.
//
// Errors (before anything is enqueued or any state changes): DeviceError for
// a parameter, gradient or state that is not on the stream's CUDA device;
// ShapeError / DTypeError for a gradient or state that does not fit; options
// invalid as in torch (ValueError); NotSupportedError for options of an
// optimizer that has no fused kernel; StateError as the CPU path (amsgrad or
// RMSprop momentum/centered enabled after the state was created).
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/gpu/stream.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/optim/optimizer.hpp"

namespace dopt::gpu {

struct FusedOptions {
  /// 16-bit parameters: create new state in float32 (default: in the parameter's dtype, as torch).
  bool fp32_state = false;
  /// 16-bit parameters: keep an fp32 master copy in state "master_param" (implies fp32 state).
  bool master_weights = false;
};

/// Whether `options` belong to an optimizer with a fused kernel (all eight built-in ones).
bool has_fused_kernel(const optim::OptimizerOptions& options) noexcept;

// As ProcessGroup: fused_step_async() enqueues the step's kernels on
// `stream` and returns their completion future (work enqueued on the stream
// afterwards runs after them, whether or not the future is kept);
// fused_step() does the same and waits for the kernels. Arguments are
// checked before anything is enqueued (errors throw, nothing changes).

/// One step over params[i] with grads[i] (an undefined grad skips its
/// parameter, like torch's None) and states[i] (created when empty, like the
/// optimizer's lazy state). Sizes must match.
Future<void> fused_step_async(const optim::OptimizerOptions& options, const std::vector<Tensor>& params,
                              const std::vector<Tensor>& grads, const std::vector<ParamState*>& states,
                              Stream& stream, const FusedOptions& fused = {});
void fused_step(const optim::OptimizerOptions& options, const std::vector<Tensor>& params,
                const std::vector<Tensor>& grads, const std::vector<ParamState*>& states, Stream& stream,
                const FusedOptions& fused = {});

/// opt.step() on the fused kernels: every parameter with a gradient, group by
/// group with the group's options, state in opt.state(). Every parameter with
/// a gradient must be on the stream's device.
Future<void> fused_step_async(optim::Optimizer& opt, Stream& stream, const FusedOptions& fused = {});
void fused_step(optim::Optimizer& opt, Stream& stream, const FusedOptions& fused = {});

/// f.step(grads) on the fused kernels (one gradient per f.params(), undefined = skip).
Future<void> fused_step_async(optim::FunctionalOptimizer& f, const std::vector<Tensor>& grads, Stream& stream,
                              const FusedOptions& fused = {});
void fused_step(optim::FunctionalOptimizer& f, const std::vector<Tensor>& grads, Stream& stream,
                const FusedOptions& fused = {});

}  // namespace dopt::gpu
