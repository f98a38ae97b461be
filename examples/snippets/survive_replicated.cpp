// Quoted by docs/fault-tolerance-optimizers.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"

// The trainer's own parts (declared only: this file is compiled, not run).
void backward(dopt::optim::Reducer& reducer);

void train_ddp_surviving(dopt::ProcessGroup world, std::vector<dopt::Tensor> params,
                         dopt::optim::Optimizer& optimizer, std::int64_t steps) {
  dopt::optim::ReducerOptions ro;
  ro.survive = true;                          // keeps each bucket's local gradients
  ro.on_membership_change = [&](const dopt::optim::ZeroRecovery& r) { world = r.group; };
  dopt::optim::Reducer reducer(params, world.new_group(world.ranks()), ro);
  for (std::int64_t step = 0; step < steps; ++step) {
    backward(reducer);                        // mark_ready(p) per parameter
    reducer.finalize();                       // after a loss: the survivors' average
    optimizer.step();
  }
}

void post_local_sgd_surviving(std::unique_ptr<dopt::optim::Optimizer> local, dopt::ProcessGroup world) {
  auto averager = std::make_unique<dopt::optim::PeriodicModelAverager>(4, 100, world);
  dopt::optim::PostLocalSGDOptimizer opt(std::move(local), std::move(averager));
  opt.enable_survive();                       // or enable_survive(callback)
  try {
    opt.step();
  } catch (const dopt::optim::MembershipChangedError& e) {
    world = e.recovery().group;               // the step was completed over the survivors
  }
}
