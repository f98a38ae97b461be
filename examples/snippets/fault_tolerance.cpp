// Quoted by docs/fault-tolerance.md and docs/fault-tolerance-optimizers.md (tests/check_docs.py checks the quotes; CI
// compiles this file).
#include <cstdint>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/zero.hpp"

// The trainer's own parts (declared only: this file is compiled, not run).
struct Batch {};
Batch batch_of(std::int64_t step, const dopt::ProcessGroup& world);
void compute_grads(const Batch& batch);
void average_grads(dopt::ProcessGroup& world);

void shrink_on_loss(dopt::ProcessGroup& world, dopt::Tensor& t) {
  try {
    world.all_reduce(t);
  } catch (const dopt::PeerLostError&) {
    dopt::ShrinkResult s = world.shrink();   // every survivor calls it
    world = s.group;                          // s.lost, s.new_rank: who went, who is who now
  }
}

void train_with_redundancy(dopt::ProcessGroup world, std::vector<dopt::Tensor> params,
                           dopt::optim::OptimizerSpec spec, std::int64_t step, std::int64_t steps) {
  dopt::optim::ZeroOptions zo{world};
  zo.redundancy = 1;                          // one buddy per shard
  dopt::optim::ZeroRedundancyOptimizer zero(params, spec, zo);

  while (step < steps) {
    try {
      compute_grads(batch_of(step, world));   // re-sharded over world's members
      average_grads(world);                    // all_reduce + divide
      zero.step();
      ++step;
    } catch (const dopt::optim::MembershipChangedError& e) {
      world = e.recovery().group;              // the step was completed
      ++step;
    } catch (const dopt::PeerLostError&) {     // lost outside step(): no step taken
      world = zero.recover().group;            // collective of the survivors
    }
  }
}

void with_callback(dopt::ProcessGroup& world, dopt::optim::ZeroOptions& zo) {
  zo.on_membership_change = [&](const dopt::optim::ZeroRecovery& r) { world = r.group; };
}
