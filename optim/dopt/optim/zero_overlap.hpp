#pragma once
// ZeroRedundancyOptimizer overlapped with the gradient reducer: torch 1.13's
// overlap_with_ddp=True with hook_with_zero_step / hook_with_zero_step_interleaved
// (see docs/zero.md), without torch's warm-up iterations and its
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
// The plan (who owns which bucket) is made by the hook factory, up front:
// every bucket of the reducer goes, whole, to one rank. Buckets are taken by
// size in bytes, largest first (stable: equal sizes in bucket order), each to
// the rank with the fewest bytes so far (ties: the lowest rank). With fewer
// buckets than ranks the surplus ranks own nothing (they only receive). The
// ranks agree on the plan by message (an all_gather of a descriptor of the
// bucket layout and the owners on ZeRO's group); a difference is a ValueError
// on every rank. So the first iteration already steps: there are no warm-up
// iterations. ZeRO's partition() / param_owners() / the local optimizer
// follow the plan (a rank's parameters: its buckets in index order, each in
// bucket order, split by parameter group), so state_dict(),
// consolidate_state_dict(), load_state_dict() and the sharded checkpoints
// work as without overlap (the global state dict layout does not depend on
// the partition).
//
// Per iteration, for each bucket b in index order, on every rank:
//   - the rank thread (Reducer::mark_ready / finalize) calls the hook: it
//     calls the inner hook (the reduction, e.g. allreduce_hook) and hands its
//     future to ZeRO's worker thread. For bucket 0 it first calls
//     Join::notify_join_context(zero) (which does something only when ZeRO is
//     the first joinable of an enabled Join), snapshots every group's
//     hyperparameters for this iteration (so learning-rate changes made
//     between iterations take effect) and hands the local state to the
//     functional optimizer.
//   - the worker thread (one per ZeRO, started by the hook factory) takes the
//     buckets in index order. interleaved: as soon as a bucket's reduction
//     completes; hook_with_zero_step: only once the last bucket has been
//     handed over (torch: after the whole backward). The owner updates the
//     bucket's parameters from the reduced bucket with the functional form
//     of the optimizer (per parameter, with its group's hyperparameters);
//     then every rank posts broadcast(bucket's parameters, owner) on ZeRO's
//     broadcast group. The worker is the only thread that issues collectives
//     on that group, always in bucket order, so every rank issues the same
//     broadcasts in the same order while the rank thread keeps issuing the
//     reductions of later buckets on the reducer's group.
//   - the hook's future for bucket b (what Reducer::finalize waits for)
//     yields the reduced bucket once b is stepped (owner) or reduced (other
//     ranks); the last bucket's future completes only after every broadcast
//     of the iteration is done and the state is back in the local optimizer.
//     So when finalize() returns the parameters hold the new values on every
//     rank, p.grad() holds the averaged gradients (as without overlap), and
//     step() has nothing left to wait for.
// Why a thread of its own and not Future::then: a then() callback runs on the
// thread that fills the future (a CAF worker of the runtime) and must stay
// short and never block (future.hpp), while a bucket's step is milliseconds
// of memory-bound work, and broadcasts issued from such callbacks would be
// issued in completion order, which differs between ranks. So nothing blocks
// the rank thread (it only hands futures over), and the worker waits on them.
// The parameters of each bucket are views into one flat buffer per bucket
// (Tensor::set_data; grads are kept): one broadcast per bucket.
//
// Equality: the functional optimizers run the class's per-parameter update,
// so a run with overlap gives bitwise the parameters and state of ZeRO
// without overlap (or of a plain optimizer) stepped with the gradients
// Reducer::finalize() writes, iteration by iteration (tests: zero.test.cpp,
// tests/zero_peer.cpp).
//
// Join (uneven inputs): put the reducer and ZeRO in the Join (either order).
// A joined rank's reducer hook shadows each iteration by running the comm
// hook over zero buckets; the hook drives ZeRO exactly as on the other ranks,
// so a joined rank keeps stepping the buckets it owns with the reduced
// gradients (the average over all ranks, joined ranks counting as zeros,
// divided by the full group size: the same value every rank gets) and keeps
// broadcasting them. Training thus goes on for every parameter and the
// joined rank's parameters stay equal to the others'. ZeRO's own join hook
// does nothing in overlap mode. (Without overlap, ZeRO's join hook steps with
// whatever p.grad() the joined rank holds; torch's overlap does what dopt
// does here.)
//
// Who calls what: both hook factories are collectives over ZeRO's group
// (the plan agreement); call them on every rank, in the same order, with the
// same reducer layout. The reducer's group must have ZeRO's ranks, and the
// reducer's parameters must be exactly ZeRO's (each parameter in one bucket).
// Between iterations (after finalize()) every ZeRO method may be called; while
// an iteration is in flight the state functions throw StateError. The ZeRO
// object must outlive the iterations of the reducer; a hook whose ZeRO is
// gone fails its bucket with StateError.
//
// Differences from torch: no warm-up iterations (torch: two, three with
// static_graph); any number of parameter groups (torch: one); group
// hyperparameters, the learning rate included, take effect (torch's
// functional path ignores them); any backend (torch: NCCL/HCCL); the plan
// balances bytes (torch: bucket i to rank i % world_size); consolidate /
// state_dict work from the first iteration; step() waits instead of warning;
// the broadcasts run on a second group (ZeroOptions::overlap_broadcast_group).
// Not done: torch's shard_buckets (a bucket split across ranks).
#include "dopt/optim/comm_hooks.hpp"
#include "dopt/optim/reducer.hpp"
#include "dopt/optim/zero.hpp"

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
