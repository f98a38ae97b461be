// Around the optimizer step: a learning-rate schedule, gradient clipping and
// loss scaling, on ZeRO. Three simulated ranks fit a linear model y = W x;
// each computes the gradient of its own batch, the Reducer averages them,
// then:
//   GradScaler      the loss is scaled by 2^k before backward, the gradients
//                   unscaled before the step; a step with inf/NaN gradients on
//                   any rank is skipped on every rank, and the scale backs off;
//   clip_grad_norm  the global norm of the gradients, each rank computing only
//                   its shard's part, one small all-reduce;
//   OneCycleLR      warm-up then annealing of lr (and of Adam's beta1), built
//                   on the ZeRO object: every owner steps with the same values.
// At step 4 rank 1's gradients overflow (an inf): all ranks skip that step.
//
//   dopt-example-schedulers        (or: dopt-run --nproc-per-node 3 dopt-example-schedulers)
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/optim/clip_grad.hpp"
#include "dopt/optim/grad_scaler.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"

using dopt::Tensor;
using namespace dopt::optim;

namespace {

constexpr int kIn = 8, kOut = 4, kBatch = 32, kSteps = 30;

// A deterministic value in [-1, 1).
float noise(unsigned a, unsigned b) {
  unsigned x = a * 2654435761u ^ (b + 0x9E3779B9u) * 2246822519u;
  x ^= x >> 15, x *= 2654435761u, x ^= x >> 13;
  return static_cast<float>(x % 20001) / 10000.0f - 1.0f;
}

// Mean squared error of W (one parameter per row) on this rank's batch;
// sets each row's gradient to d(loss * scale)/d(row).
double loss_and_grads(const std::vector<Tensor>& rows, int rank, double scale) {
  double loss = 0;
  for (const Tensor& r : rows) r.set_grad(Tensor::zeros({kIn}));
  for (int s = 0; s < kBatch; ++s) {
    float x[kIn];
    for (int i = 0; i < kIn; ++i) x[i] = noise(100 * rank + s, i);
    for (int o = 0; o < kOut; ++o) {
      const float* w = rows[o].data<float>();
      float* g = rows[o].grad().data<float>();
      float y = 0, target = 0;
      for (int i = 0; i < kIn; ++i) {
        y += w[i] * x[i];
        target += 0.5f * static_cast<float>((o + i) % 3 - 1) * x[i];  // the true W*
      }
      const float err = y - target;
      loss += err * err / kBatch;
      for (int i = 0; i < kIn; ++i) g[i] += static_cast<float>(scale * 2.0 * err * x[i] / kBatch);
    }
  }
  return loss;
}

void train(dopt::RankContext& ctx) {
  const int rank = ctx.rank();
  // W as one parameter per row: ZeRO spreads them over the ranks.
  std::vector<Tensor> params;
  for (int o = 0; o < kOut; ++o) params.push_back(Tensor::zeros({kIn}));
  Reducer reducer(params, ctx.world());
  ZeroRedundancyOptimizer zero(params, AdamOptions(1e-2), ZeroOptions{ctx.world()});
  OneCycleLROptions one_cycle;
  one_cycle.max_lr = {0.1};
  one_cycle.total_steps = kSteps;
  OneCycleLR sched(zero, one_cycle);          // lr 0.004 at step 0, 0.1 at 30%, then down
  GradScaler scaler(GradScalerOptions{.init_scale = 1024.0, .growth_interval = 10});

  double first = 0, last = 0;
  int skipped = 0;
  for (int step = 0; step < kSteps; ++step) {
    const double loss = loss_and_grads(params, rank, scaler.get_scale());  // backward of loss * scale
    if (step == 4 && rank == 1) params[2].grad().data<float>()[3] = std::numeric_limits<float>::infinity();
    for (int o = kOut; o-- > 0;) reducer.mark_ready(params[o]);
    reducer.finalize();                                   // gradients averaged over the ranks
    scaler.unscale_(zero);                                // true gradients, before clipping
    const double norm = clip_grad_norm(zero, 1.0);        // sharded, the same on every rank
    const bool stepped = scaler.step(zero);               // skipped on every rank after an inf
    scaler.update();
    sched.step();
    skipped += !stepped;
    if (step == 0) first = loss;
    last = loss;
    if (rank == 0 && (step % 5 == 0 || !stepped))
      std::printf("step %2d  loss %.5f  grad norm %9.4g  %s  next lr %.4f  scale %g\n", step, loss, norm,
                  stepped ? "stepped" : "SKIPPED on every rank", sched.get_last_lr()[0], scaler.get_scale());
  }
  if (rank == 0) std::printf("loss %.5f -> %.5f, %d step(s) skipped\n", first, last, skipped);
  if (skipped != 1 || !(last < first / 4)) throw dopt::StateError("example", "unexpected training result", rank);
}

}  // namespace

int main() {
  try {
    dopt::RunOptions options;
    options.simulated_ranks = 3;
    dopt::run_distributed(train, options);
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
