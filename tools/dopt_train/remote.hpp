#pragma once
// dopt-train --optim remote: DistributedOptimizer with parameter owners, over
// dopt::rpc (remote.cpp, built when distributed/dopt/distributed/distributed_optimizer.hpp
// is there: DOPT_TRAIN_HAVE_REMOTE).
//
// Every worker is a trainer. Each parameter has one owner worker (ZeRO's
// greedy partition: largest first to the least loaded), which holds the
// parameter and, inside the DistributedOptimizer, its optimizer state. A step:
//   1. every trainer fetches the parameters from their owners (RRef::to_here);
//   2. forward and backward on its own batch;
//   3. it sends its gradients to worker 0, which averages them in rank order
//      (sum_r g_r / N, like the DDP reducer), deposits the average into one
//      gradient context and calls DistributedOptimizer::step(ctx): one
//      message per owner, each owner runs the inner optimizer on its
//      parameters;
//   4. worker 0 tells every trainer the step is done.
// Synchronous and deterministic: the same results simulated and under dopt-run.
#include "plan.hpp"

namespace dopt_train {

/// Runs the whole training (simulated workers or this process's worker).
void run_remote(const Plan& plan);

}  // namespace dopt_train
