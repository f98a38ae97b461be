// Post-local SGD: global data parallelism for a warm-up, then local steps
// with the parameters averaged every `period` steps. Two halves:
//  * the gradient side: the Reducer's post_localSGD_hook averages gradients
//    over all ranks during warm-up, afterwards (post_local_gradient_allreduce
//    = false) leaves them local;
//  * the parameter side: PostLocalSGDOptimizer steps SGD, then its
//    PeriodicModelAverager averages the parameters every `period` steps.
// Each rank minimises (w - target_r)^2 with its own target, so between
// averagings the ranks drift apart; the printout shows the spread.
//
//   dopt-example-post-local-sgd   (or: dopt-run --nproc-per-node 4 dopt-example-post-local-sgd)
#include <cstdio>
#include <memory>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/sgd.hpp"

using dopt::Tensor;
using namespace dopt::optim;

namespace {

void train(dopt::RankContext& ctx) {
  const int rank = ctx.rank(), n = ctx.world_size();
  Tensor w = Tensor::zeros({4});
  std::vector<Tensor> params{w};

  PostLocalSGDConfig cfg{ctx.world()};
  cfg.start_localSGD_iter = 3;  // global averaging of gradients for 3 steps
  cfg.period = 4;               // then average the parameters every 4 steps
  cfg.post_local_gradient_allreduce = false;
  auto hook_state = cfg.make_hook_state();

  Reducer reducer(params, ctx.world());
  reducer.register_comm_hook(post_localSGD_hook(hook_state));
  PostLocalSGDOptimizer opt(std::make_unique<SGD>(params, SGDOptions(0.1)), cfg.make_averager(), *hook_state);

  const float target = static_cast<float>(rank);  // each rank's "data"
  Tensor spread = Tensor::empty({2});
  for (int step = 0; step < 12; ++step) {
    std::vector<float> g(4);
    for (int i = 0; i < 4; ++i) g[i] = 2 * (w.data<float>()[i] - target);
    w.set_grad(Tensor::from_vector(g));
    reducer.mark_ready(w);
    reducer.finalize();
    const bool averages = opt.averager().will_average();
    opt.step();

    // Spread of w[0] over the ranks: max and -min (all_reduce MAX).
    spread.data<float>()[0] = w.data<float>()[0];
    spread.data<float>()[1] = -w.data<float>()[0];
    ctx.world().all_reduce(spread, dopt::ReduceOp::max);
    if (rank == 0)
      std::printf("step %2d  %-28s  w[0] over %d ranks: %.4f .. %.4f\n", step,
                  step < cfg.start_localSGD_iter ? "warm-up (global gradients)"
                  : averages                     ? "local step + model averaging"
                                                 : "local step",
                  n, -spread.data<float>()[1], spread.data<float>()[0]);
  }
}

}  // namespace

int main() {
  try {
    dopt::RunOptions options;
    options.simulated_ranks = 4;
    dopt::run_distributed(train, options);
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
