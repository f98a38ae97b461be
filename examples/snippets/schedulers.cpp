// Quoted by docs/schedulers.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <cmath>
#include <memory>

#include "dopt/optim/clip_grad.hpp"
#include "dopt/optim/grad_scaler.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/distributed/zero.hpp"

using namespace dopt::optim;

void composites(Optimizer& opt) {
  std::vector<std::unique_ptr<LRScheduler>> phases;
  phases.push_back(std::make_unique<LinearLR>(opt, 0.1, 1.0, 5));   // warm-up
  phases.push_back(std::make_unique<CosineAnnealingLR>(opt, 95));   // then cosine
  SequentialLR sched(opt, std::move(phases), {5});
}

void resume(Optimizer& opt, Optimizer& opt2, LRScheduler& sched, LRScheduler& sched2) {
  opt2.load_state_dict(opt.state_dict());
  sched2.load_state_dict(sched.state_dict());   // same class; StateDictError otherwise
}

void clipping(std::vector<dopt::Tensor>& params, std::vector<OptimizerParamGroup>& groups,
              std::vector<dopt::Tensor>& grads, ZeroRedundancyOptimizer& zero) {
  double norm = clip_grad_norm(params, /*max_norm=*/1.0);                  // L2 over all gradients
  clip_grad_norm(groups, 1.0, {.norm_type = 1.0});                         // param groups, L1
  clip_grad_norm(params, 1.0, {.norm_type = kInfNorm, .num_threads = 2});  // max |g|
  clip_gradients(grads, 1.0);                                              // gradient tensors themselves
  double total = clip_grad_norm(zero, 1.0);                                // ZeRO: sharded, collective
  (void)norm;
  (void)total;
}

// Gradients of loss * scale (your trainer's backward).
void backward(double scaled_loss);

int grad_scaler(Optimizer& opt, std::vector<dopt::Tensor>& params, double loss, int steps) {
  int skipped = 0;
  GradScaler scaler;  // scale 65536, x2 after 2000 good steps in a row, x0.5 after an inf/NaN
  for (int step = 0; step < steps; ++step) {
    backward(scaler.scale(loss));   // gradients of loss * scale
    scaler.unscale_(opt);           // optional: to clip the true gradients
    clip_grad_norm(params, 1.0);
    bool stepped = scaler.step(opt);  // false: inf/NaN found, no update
    scaler.update();
    if (!stepped) ++skipped;
  }
  return skipped;
}
