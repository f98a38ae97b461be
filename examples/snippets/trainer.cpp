// Quoted by docs/trainer.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/trainer.hpp"
#include "dopt/distributed/zero.hpp"

void training_loop(dopt::RankContext& ctx, int steps) {
  std::vector<dopt::Tensor> params = snippets::make_model();
  dopt::optim::ZeroRedundancyOptimizer opt(params, dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}},
                                            dopt::optim::ZeroOptions{ctx.world()});
  dopt::CoordinatedStop stop;  // Ctrl-C or SIGTERM on any rank: every rank stops after the same step
  for (int step = 0; step < steps; ++step) {
    double loss = 0.0;
    for (auto& p : params) p.set_grad(snippets::local_grad(p, ctx.rank()));  // your forward and backward
    dopt::average_gradients(params, ctx.world());  // each gradient becomes its mean over the ranks
    opt.step();
    const auto mean = dopt::all_reduce_metrics(ctx.world(), {{"loss", loss}});
    if (ctx.rank() == 0) std::printf("step %d: loss %.4f\n", step, mean.at("loss"));
    if (stop.should_stop(ctx.world())) break;  // every rank: the same answer at the same step
  }
}
