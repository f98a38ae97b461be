// ZeroRedundancyOptimizer with the single-rank training utilities of
// dopt/optim/ (zero.hpp): sharded clip_grad_norm, GradScaler, LR schedulers.
#include <string>
#include <vector>

#include "dopt/optim/internal/clip_grad_sharded.hpp"
#include "dopt/optim/grad_scaler.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/distributed/zero.hpp"

namespace dopt::optim {

double clip_grad_norm(ZeroRedundancyOptimizer& zero, double max_norm, const ClipGradNormOptions& options) {
  const std::string op = "clip_grad_norm(ZeroRedundancyOptimizer)";
  const int rank = zero.rank();
  if (zero.overlap_with_ddp())
    throw StateError(op, "not with overlap_with_ddp (the gradients are consumed bucket by bucket during backward)",
                     rank);
  return detail::clip_grad_norm_sharded(zero.all_params(), zero.param_owners(), rank, zero.process_group(), max_norm,
                                        options, op);
}

void grad_scaler_unscale(GradScaler& scaler, ZeroRedundancyOptimizer& zero) {
  if (!scaler.is_enabled()) return;
  const char* op = "GradScaler.unscale_";
  if (zero.overlap_with_ddp())
    throw NotSupportedError(op, "ZeroRedundancyOptimizer with overlap_with_ddp steps inside backward; unscale and "
                                "check the gradients in the comm hook instead", zero.rank());
  std::vector<Tensor> owned;
  const auto owners = zero.param_owners();
  const auto& all = zero.all_params();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (owners[i] == zero.rank()) {
      Tensor g = all[i].grad();
      if (g.defined()) owned.push_back(std::move(g));
    }
  scaler.unscale_grads(&zero, owned, zero.process_group(), op);
}

bool grad_scaler_step(GradScaler& scaler, ZeroRedundancyOptimizer& zero) {
  return scaler.step_with(
      &zero, "GradScaler.step", [&] { zero.step(); }, [] {}, [&] { grad_scaler_unscale(scaler, zero); });
}

std::shared_ptr<ParamGroupAccess> schedule_access(ZeroRedundancyOptimizer& zero) {
  return param_group_access("ZeroRedundancyOptimizer", &zero, zero.param_groups());
}

}  // namespace dopt::optim
