#pragma once
// ZeroRedundancyOptimizer overlapped with the gradient reducer: torch 1.13's
// overlap_with_ddp=True with hook_with_zero_step / hook_with_zero_step_interleaved
// (see docs/zero-overlap.md), without torch's warm-up iterations and its
// single-parameter-group limit.
//
//   ZeroRedundancyOptimizer zero(groups, OptimizerSpec{"Adam", {{"lr", 1e-3}}},
//                                ZeroOptions{ctx.world(), false, /*overlap_with_ddp=*/true});
//   Reducer reducer(params, ctx.world());
//   reducer.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), reducer, zero));
//   for (...) {
//     for (each param p, as its gradient becomes ready) { p.set_grad(g); reducer.mark_ready(p); }
//     reducer.finalize();   // returns once every bucket is stepped and broadcast
//     zero.step();          // optional: a cheap wait (rethrows a failed iteration)
//   }
//
// docs/zero-overlap.md explains the plan (each
// bucket, whole, to one rank, by bytes), the worker thread, the equality with
// ZeRO without overlap, Join and the differences from torch.
//
// Who calls what: both hook factories are collectives over ZeRO's group
// (the ranks agree on the plan; a different bucket layout is a ValueError on
// every rank); call them on every rank, in the same order, with the same
// reducer layout. The reducer's group must have ZeRO's ranks, and the
// reducer's parameters must be exactly ZeRO's (each parameter in one bucket).
//
// Threads, per iteration: the rank thread (Reducer::mark_ready / finalize)
// calls the hook, which starts the bucket's reduction and hands its future to
// ZeRO's worker thread (one per ZeRO, started by the hook factory); for
// bucket 0 it first calls Join::notify_join_context(zero) and snapshots the
// groups' hyperparameters. The worker steps each bucket its rank owns and is
// the only thread issuing collectives on ZeRO's broadcast group, in bucket
// order (interleaved: as each reduction completes; hook_with_zero_step: once
// the last bucket was handed over). When finalize() returns, the parameters
// hold the new values on every rank and p.grad() the averaged gradients.
//
// Between iterations (after finalize()) every ZeRO method may be called; while
// an iteration is in flight the state functions throw StateError. The ZeRO
// object must outlive the iterations of the reducer; a hook whose ZeRO is
// gone fails its bucket with StateError.
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"

namespace dopt::optim {

/// torch's hook_with_zero_step: the buckets are stepped once the whole
/// backward has handed them over (the last bucket's hook call). Collective
/// (see the header). ValueError when zero was not built with
/// overlap_with_ddp, when the reducer's parameters are not zero's, or when
/// the ranks' plans differ; StateError for a plan made from another layout.
CommHook hook_with_zero_step(CommHook hook, const Reducer& reducer, ZeroRedundancyOptimizer& zero);

/// torch's hook_with_zero_step_interleaved: each bucket is stepped as soon as
/// its reduction completes. Same contract as hook_with_zero_step.
CommHook hook_with_zero_step_interleaved(CommHook hook, const Reducer& reducer, ZeroRedundancyOptimizer& zero);

}  // namespace dopt::optim
