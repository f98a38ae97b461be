// Quoted by docs/rpc.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <cmath>

#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "dopt/optim/lr_scheduler.hpp"

using namespace dopt;

void distributed_optimizer(rpc::Agent& agent, const std::vector<rpc::RRef<Tensor>>& rrefs, const rpc::GradContext& ctx) {
  optim::DistributedOptimizer opt(agent, optim::OptimizerSpec{"SGD", {{"lr", 0.05}, {"momentum", 0.9}}}, rrefs);
  opt.step(ctx);                        // or step_async(ctx) -> Future<void>
  opt.zero_grad(ctx);                   // drop ctx's gradients of these parameters on every owner
  opt.set_lr(0.01);                     // every owner; set_hyperparameters({...}); lrs()
  optim::DistributedLambdaLR sched(opt, [](int epoch) { return std::pow(0.9, epoch); });
  sched.step();
  optim::CosineAnnealingLR cosine(opt, /*T_max=*/100);  // any scheduler (schedulers.md): each step
  cosine.step();                                          // reaches every owner in one round
}
