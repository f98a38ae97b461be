// DistributedOptimizer with the single-rank training utilities of
// dopt/optim/ (distributed_optimizer.hpp): GradScaler, LR schedulers.
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "dopt/optim/grad_scaler.hpp"
#include "dopt/optim/lr_scheduler.hpp"

namespace dopt::optim {
namespace {

/// One group; changes are staged and committed to every owner in one round.
class DistributedAccess : public ParamGroupAccess {
 public:
  explicit DistributedAccess(DistributedOptimizer& d) : d_(d) {}
  std::string name() const override { return "DistributedOptimizer"; }
  const void* identity() const override { return &d_; }
  std::size_t num_groups() const override { return 1; }
  Hyperparams get(std::size_t /*g*/) const override { return d_.hyperparameters(); }
  void set(std::size_t /*g*/, const Hyperparams& h) override { d_.stage_hyperparameters(h); }
  std::optional<double>& initial_lr(std::size_t /*g*/) override { return d_.initial_lr(); }
  void commit() override { d_.commit_hyperparameters(); }

 private:
  DistributedOptimizer& d_;
};

}  // namespace

void grad_scaler_unscale(GradScaler& scaler, DistributedOptimizer& optimizer, const std::vector<Tensor>& grads) {
  if (!scaler.is_enabled()) return;
  std::vector<Tensor> defined;
  for (const auto& g : grads)
    if (g.defined()) defined.push_back(g);
  scaler.unscale_grads(&optimizer, defined, ProcessGroup{}, "GradScaler.unscale_");
}

bool grad_scaler_step(GradScaler& scaler, DistributedOptimizer& optimizer, const rpc::GradContext& ctx) {
  const char* op = "GradScaler.step";
  if (scaler.is_enabled() && scaler.untouched(&optimizer))
    throw StateError(op, "a DistributedOptimizer's gradients live on its owners: call unscale_(optimizer, grads) "
                         "before depositing them, then step()");
  return scaler.step_with(
      &optimizer, op, [&] { optimizer.step(ctx); },
      [&] {
        ctx.deposits_done().get();  // then nothing of this context is left on the owners
        optimizer.zero_grad(ctx);
      },
      [] {});
}

std::shared_ptr<ParamGroupAccess> schedule_access(DistributedOptimizer& optimizer) {
  return std::make_shared<DistributedAccess>(optimizer);
}

}  // namespace dopt::optim
