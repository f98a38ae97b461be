// Quoted by docs/zero-stage2-3.md, "Stage 2" (tests/check_docs.py checks the quotes; CI compiles this file).
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/adam.hpp"
#include "common.hpp"

void zero_stage2(int steps) {
  dopt::simulate(4, [&](dopt::RankContext& ctx) {
    using namespace dopt::optim;
    std::vector<dopt::Tensor> params = snippets::make_model();
    ZeroRedundancyOptimizer zero(params, AdamOptions(1e-3), ZeroOptions{ctx.world()});
    Reducer reducer(params, ctx.world(), zero_stage2_options(zero, params));   // stage 2: gradients sharded
    for (int step = 0; step < steps; ++step) {
      for (std::size_t i = params.size(); i-- > 0;) {   // in the order backward produces the gradients
        params[i].set_grad(snippets::local_grad(params[i], ctx.rank()));
        reducer.mark_ready(params[i]);   // drops params[i].grad() unless this rank owns params[i]
      }
      reducer.finalize();      // the averaged gradients of the owned parameters, nothing else
      zero.step();             // stage 1's step: the owned shard, then the broadcasts
      zero.zero_grad(/*set_to_none=*/true);
    }
  });
}
