// Quoted by docs/ddp.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/sgd.hpp"
#include "common.hpp"

using namespace dopt::optim;

void ddp_loop(dopt::RankContext& ctx, int steps) {
  std::vector<dopt::Tensor> params = snippets::make_model();
  SGD opt(params, SGDOptions(0.1));
  Reducer reducer(params, ctx.world());            // broadcasts params from rank 0
  for (int step = 0; step < steps; ++step) {
    for (std::size_t i = params.size(); i-- > 0;) {  // in the order backward produces the gradients
      params[i].set_grad(snippets::local_grad(params[i], ctx.rank()));
      reducer.mark_ready(params[i]);
    }
    reducer.finalize();                           // every p.grad() = average over ranks
    opt.step();
  }
}
