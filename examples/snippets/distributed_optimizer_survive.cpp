// Quoted by docs/fault-tolerance-optimizers.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <cstdint>
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"

using namespace dopt;

// grads_of(t): the trainer's gradients of step t, one per parameter.
void train_surviving_owners(rpc::Agent& agent, const optim::OptimizerSpec& spec,
                            const std::vector<rpc::RRef<Tensor>>& params, std::int64_t steps,
                            std::vector<Tensor> (*grads_of)(std::int64_t)) {
  optim::DistributedOptimizerOptions o;
  o.redundancy = 1;                                   // one buddy owner per owner
  optim::DistributedOptimizer opt(agent, spec, params, o);
  for (std::int64_t t = 0; t < steps; ++t) {
    const std::vector<Tensor> grads = grads_of(t);
    rpc::GradContext ctx = agent.new_context();
    for (std::size_t i = 0; i < grads.size(); ++i)
      (void)ctx.deposit(opt.parameters()[i], grads[i]);  // parameters(): re-pointed after a takeover
    try {
      opt.step(ctx);
    } catch (const optim::OwnersChangedError& e) {    // a MembershipChangedError
      if (!e.recovery().step_completed) {              // gradients that went with the lost owner:
        for (auto i : e.owner_recovery().needs_gradient)
          (void)ctx.deposit(opt.parameters()[i], grads[i]);  // again, on the owner that took over
        opt.step(ctx);                                 // owners that applied the step skip it
      }
    }
  }
}

void with_callback(rpc::Agent& agent, const optim::OptimizerSpec& spec, const std::vector<rpc::RRef<Tensor>>& params,
                   const std::vector<Tensor>& grads) {
  optim::DistributedOptimizer* opt = nullptr;
  optim::DistributedOptimizerOptions o;
  o.redundancy = 1;
  o.on_membership_change = [&](const optim::OwnerRecovery& r) {  // step() then completes the step
    rpc::GradContext ctx = agent.attach_context(r.context);
    for (auto i : r.needs_gradient) ctx.deposit(opt->parameters()[i], grads[i]).get();
  };
  optim::DistributedOptimizer d(agent, spec, params, o);
  opt = &d;
}
