// Quoted by docs/post-local-sgd.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/sgd.hpp"
#include "common.hpp"

void post_local_sgd(int steps) {
  dopt::simulate(4, [steps](dopt::RankContext& ctx) {
    using namespace dopt::optim;
    std::vector<dopt::Tensor> params = snippets::make_model();
    PostLocalSGDConfig cfg(ctx.world());
    cfg.start_localSGD_iter = 100;   // global data parallelism for 100 steps
    cfg.period = 4;                  // then average parameters every 4 steps
    auto state = cfg.make_hook_state();
    Reducer reducer(params, ctx.world());
    reducer.register_comm_hook(post_localSGD_hook(state));
    PostLocalSGDOptimizer opt(std::make_unique<SGD>(params, SGDOptions(0.1)), cfg.make_averager(), *state);
    for (int step = 0; step < steps; ++step) {
      // backward: set p.grad() and reducer.mark_ready(p) as each gradient is ready
      for (auto& p : params) {
        p.set_grad(snippets::local_grad(p, ctx.rank()));
        reducer.mark_ready(p);
      }
      reducer.finalize();
      opt.step();                    // local step, then averaging on schedule
    }
  });
}
