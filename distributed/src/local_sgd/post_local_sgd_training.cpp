// PostLocalSGDOptimizer with the single-rank training utilities of
// dopt/optim/ (post_local_sgd.hpp): clip_grad_norm, GradScaler, LR schedulers.
#include <vector>

#include "dopt/optim/grad_scaler.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/distributed/post_local_sgd.hpp"

namespace dopt::optim {

double clip_grad_norm(PostLocalSGDOptimizer& optimizer, double max_norm, const ClipGradNormOptions& options) {
  return clip_grad_norm(optimizer.param_groups(), max_norm, options);
}

void grad_scaler_unscale(GradScaler& scaler, PostLocalSGDOptimizer& optimizer) {
  if (!scaler.is_enabled()) return;
  scaler.unscale_grads(&optimizer, optimizer.param_groups(), optimizer.averager().process_group(),
                       "GradScaler.unscale_");
}

bool grad_scaler_step(GradScaler& scaler, PostLocalSGDOptimizer& optimizer) {
  return scaler.step_with(
      &optimizer, "GradScaler.step", [&] { optimizer.step(); }, [&] { optimizer.skip_step(); },
      [&] { grad_scaler_unscale(scaler, optimizer); });
}

std::shared_ptr<ParamGroupAccess> schedule_access(PostLocalSGDOptimizer& optimizer) {
  Optimizer& o = optimizer.optim();
  return param_group_access(o.name(), &o, o.param_groups());
}

}  // namespace dopt::optim
