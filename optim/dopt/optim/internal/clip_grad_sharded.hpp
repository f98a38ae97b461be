#pragma once
// Internal (not installed): the sharded clipping that clip_grad_norm(zero)
// (dopt/distributed/zero.hpp) runs, with clip_grad.cpp's kernels and exact
// reduction orders. It knows ranks and owners, not ZeRO.
#include <string>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/optim/clip_grad.hpp"

namespace dopt::optim::detail {

/// Collective over `group`: every rank passes every parameter (`all`), the
/// rank that owns each (`owners`) and its own `rank`. Each rank reads and
/// scales only the gradients it owns; one all-reduce gives every rank every
/// owner's norms; the total is torch's over the full gradients (by global
/// index). Errors name `op` and `rank`.
double clip_grad_norm_sharded(const std::vector<Tensor>& all, const std::vector<int>& owners, int rank,
                              ProcessGroup group, double max_norm, const ClipGradNormOptions& options,
                              const std::string& op);

}  // namespace dopt::optim::detail
