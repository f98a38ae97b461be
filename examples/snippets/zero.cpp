// Quoted by docs/zero.md and docs/zero-overlap.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include "dopt/actors/join.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_overlap.hpp"
#include "common.hpp"

using snippets::make_model;

// All-reduces the batch's gradients and divides by the world size.
void compute_and_average_grads(const std::vector<dopt::Tensor>& params, int batch, const dopt::ProcessGroup& world);

void using_it(const std::vector<int>& batches) {
  dopt::simulate(4, [&](dopt::RankContext& ctx) {
    std::vector<dopt::Tensor> params = make_model();      // same on every rank
    dopt::optim::ZeroRedundancyOptimizer zero(
        params, dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}},
        dopt::optim::ZeroOptions{ctx.world(), /*parameters_as_bucket_view=*/true});
    for (auto& batch : batches) {
      compute_and_average_grads(params, batch, ctx.world());   // e.g. all_reduce + divide
      zero.step();                                             // local step + broadcasts
      zero.zero_grad();
    }
  });
}

void join(dopt::optim::Reducer& grad_averager, dopt::optim::ZeroRedundancyOptimizer& zero,
          std::vector<std::vector<dopt::Tensor>>& my_batches) {
  dopt::Join join({&grad_averager, &zero});   // the first joinable notifies
  for (auto& batch : my_batches) {
    for (auto& g : batch) grad_averager.mark_ready(g);
    grad_averager.finalize();
    zero.step();
  }
  join.finish();                              // torch: leaving the `with` block
}

void overlap(dopt::RankContext& ctx, std::vector<dopt::optim::OptimizerParamGroup> groups,
             std::vector<dopt::Tensor>& params, int steps) {
  using namespace dopt::optim;
  ZeroOptions zo{ctx.world()};
  zo.overlap_with_ddp = true;
  ZeroRedundancyOptimizer zero(groups, OptimizerSpec{"Adam", {{"lr", 1e-3}}}, zo);
  Reducer reducer(params, ctx.world());
  reducer.register_comm_hook(
      hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), reducer, zero));   // collective: the plan
  for (int step = 0; step < steps; ++step) {
    for (std::size_t i = params.size(); i-- > 0;) {  // in the order backward produces the gradients
      params[i].set_grad(snippets::local_grad(params[i], ctx.rank()));
      reducer.mark_ready(params[i]);
    }
    reducer.finalize();   // returns when every bucket is stepped and broadcast
    zero.step();          // optional: a cheap wait (rethrows a failed iteration)
  }
}
