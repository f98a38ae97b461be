// Quoted by docs/zero.md and docs/post-local-sgd.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include "dopt/actors/future.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/sgd.hpp"
#include "common.hpp"

// The gradients of a batch, averaged over the ranks (they read the parameters).
void averaged_grads(const std::vector<dopt::Tensor>& params, int batch, const dopt::ProcessGroup& world);
// The trainer's own work that touches no parameter (loading the next batch, logging, ...).
void load_next_batch(int batch);

void zero_step_async(const std::vector<int>& batches) {
  dopt::simulate(3, [&](dopt::RankContext& ctx) {
    std::vector<dopt::Tensor> params = snippets::make_model();
    dopt::optim::ZeroRedundancyOptimizer zero(params, dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}},
                                              dopt::optim::ZeroOptions{ctx.world()});
    for (int batch : batches) {
      averaged_grads(params, batch, ctx.world());
      dopt::Future<void> step = zero.step_async();   // the local step here, the broadcasts in flight
      zero.zero_grad();                               // gradients only: no wait
      load_next_batch(batch + 1);                     // meanwhile, nothing that reads a parameter
      step.get();                                     // the parameters are final (or the error is thrown)
    }
  });
}

void post_local_sgd_step_async(int steps) {
  dopt::simulate(3, [steps](dopt::RankContext& ctx) {
    using namespace dopt::optim;
    std::vector<dopt::Tensor> params = snippets::make_model();
    PostLocalSGDOptimizer opt(std::make_unique<SGD>(params, SGDOptions(0.1)),
                              std::make_unique<PeriodicModelAverager>(/*period=*/4, /*warmup_steps=*/0, ctx.world()));
    dopt::Future<void> last;
    for (int step = 0; step < steps; ++step) {
      if (last.valid()) last.get();                   // before the forward pass reads the parameters
      for (auto& p : params) p.set_grad(snippets::local_grad(p, ctx.rank()));
      last = opt.step_async();                        // the local step here, the average in flight
      load_next_batch(step + 1);
    }
    if (last.valid()) last.get();
  });
}
