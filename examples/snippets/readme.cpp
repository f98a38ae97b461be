// Quoted by README.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/trainer.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "common.hpp"

using snippets::make_model;

void distributed_in_a_few_lines(int steps) {
  dopt::RunOptions options;
  options.simulated_ranks = 4;   // started alone: 4 simulated ranks; under dopt-run: one rank per process
  dopt::run_distributed([steps](dopt::RankContext& ctx) {
    std::vector<dopt::Tensor> params = make_model();
    dopt::optim::ZeroRedundancyOptimizer opt(params, dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}},
                                              dopt::optim::ZeroOptions{ctx.world()});
    for (int step = 0; step < steps; ++step) {
      for (auto& p : params) p.set_grad(snippets::local_grad(p, ctx.rank()));  // your backward pass
      dopt::average_gradients(params, ctx.world());  // the mean over the ranks (or a Reducer: docs/ddp.md)
      opt.step();                                    // each rank steps its shard, then the shards are broadcast
    }
  }, options);
}

void a_short_tour(dopt::Tensor w, dopt::Tensor b, const dopt::Tensor& dw, const dopt::Tensor& db, int steps) {
  std::vector<dopt::Tensor> params = {w, b};          // your tensors, or views of your buffers
  dopt::optim::Adam opt(params, dopt::optim::AdamOptions(1e-3).betas({0.9, 0.999}));
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    w.set_grad(dw); b.set_grad(db);                    // gradients your trainer computed
    opt.step();
  }
  dopt::save_state_dict(opt.state_dict(), "optim.safetensors");
}
