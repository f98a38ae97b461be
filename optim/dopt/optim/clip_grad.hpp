#pragma once
// Gradient clipping by total norm: torch.nn.utils.clip_grad_norm_ (1.13),
// bit for bit, locally and sharded over ZeroRedundancyOptimizer's ranks.
//
//   double norm = clip_grad_norm(model_params, /*max_norm=*/1.0);          // L2
//   clip_grad_norm(model_params, 1.0, {.norm_type = kInfNorm});            // max |g|
//   clip_grad_norm(zero, 1.0);   // ZeRO: each rank its own shard, one all-reduce
//                                // (declared in dopt/distributed/zero.hpp)
//
// What it computes (as torch): the norm of each gradient, then the norm of
// those norms (the total norm, the gradients seen as one vector), then
// coef = min(max_norm / (total + 1e-6), 1) and every gradient *= coef. The
// total norm before clipping is returned. Parameters without a gradient are
// left out; with none at all the result is 0 and nothing changes.
//
// Exactness: for float32 and float64 gradients the per-gradient norms, the
// total and the coefficient are torch 1.13's CPU values bit for bit (the same
// summation order: for float32 L2 eight lanes of fused multiply-adds, then
// the lanes left to right, then the remainder; float64 L2 and every L1 sum
// one element at a time; the max for infinity). Other p > 0 use torch's
// generic formula (sum of |g|^p, then ^(1/p)). Gradients of mixed float32 and
// float64 give a float64 total, as torch.stack does. float16/bfloat16
// gradients are summed and clipped in float32 and the total is returned in
// float32: torch computes it in the 16-bit type, where a total norm above
// 65504 (float16) is infinity and clips every gradient to zero.
//
// Devices: CPU gradients only (NotSupportedError otherwise, naming the op).
//
// Threads: options.num_threads spreads the per-gradient norms and the scaling
// over that many threads (the caller's included); the result does not depend
// on it.
#include <limits>
#include <vector>

#include "dopt/optim/optimizer.hpp"

namespace dopt::optim {

/// norm_type for the infinity norm (the largest |g|).
inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

struct ClipGradNormOptions {
  /// p of the p-norm: any p > 0, or kInfNorm.
  double norm_type = 2.0;
  /// A non-finite total norm (NaN or infinite) is a dopt::ValueError and no
  /// gradient changes; otherwise such a norm clips every gradient to NaN or
  /// zero, as torch does.
  bool error_if_nonfinite = false;
  /// Threads for the norms and the scaling (>= 1).
  int num_threads = 1;
};

/// torch's clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite)
/// over the gradients of `params` (param.grad()), in order. Returns the total
/// norm. max_norm must be finite (ValueError); norm_type must be > 0
/// (ValueError).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, const ClipGradNormOptions& options = {});
/// The same over every parameter of the groups, in group order.
double clip_grad_norm(const std::vector<OptimizerParamGroup>& groups, double max_norm,
                      const ClipGradNormOptions& options = {});
/// The same over the gradient tensors themselves (undefined ones are left
/// out): for gradients that do not live in param.grad(), e.g. the ones a
/// DistributedOptimizer trainer deposits in a GradContext.
double clip_gradients(const std::vector<Tensor>& grads, double max_norm, const ClipGradNormOptions& options = {});

/// The norm of one gradient as torch.norm(g, p) computes it (p > 0 or
/// kInfNorm), in g's dtype (float32 for 16-bit tensors). CPU, floating point.
double grad_norm(const Tensor& g, double norm_type = 2.0);

}  // namespace dopt::optim
