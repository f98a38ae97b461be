#pragma once
// dopt::libtorch::FullyShard: ZeRO stage 3 (sharded parameters) for the
// torch::nn::Module units of a libtorch C++ model, over dopt's ShardedUnits
// (dopt/distributed/zero_stage3.hpp), driven by autograd hooks as
// python/dopt/fully_shard.py is. docs/libtorch.md ("Sharded parameters
// (ZeRO-3)") explains it and its limits.
//
//   dopt::libtorch::FullyShard fs({net->ptr(0), net->ptr(2), net->ptr(4)},
//                                 dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}},
//                                 dopt::optim::ShardedUnitsOptions{ctx.world()});
//   for (...) {
//     auto loss = fs.forward(net, x).square().sum();   // or fs.forward(u, [&] { return unit->forward(h); })
//     loss.backward();                                  // hooks gather, reduce and free the units
//     fs.step();                                        // local: this rank's shards
//   }
//
// Memory. The constructor hands each unit's trainable parameters (those
// with requires_grad; frozen ones stay whole and in no unit) to
// ShardedUnits, which keeps this rank's shard, and leaves every such torch
// parameter empty (numel 0). A unit's parameters are views of one flat
// buffer only while the unit is gathered: inside forward(u, ...), and in the
// backward from the gradient of the unit's output until the gradients of
// all its parameters exist. The flat buffer's storage is then the memory of
// ShardedUnits' all_gather (no copy); released, the storage holds no memory
// (its size is 0) and the views autograd saved in the forward keep pointing
// at it, so a later gather makes them valid again. Once the unit's
// gradients exist its gathered memory becomes their reduction buffer
// (ShardedUnits::release_for_gradients). The backward's unit-sized buffers
// (sharded().buffer_bytes()), by FullyShardOptions::backward_prefetch:
// before_backward (the default) three (unit u gathered, u-1's all_gather
// in flight during u's backward, u+1's reduction); after_gradients two (u-1
// is gathered into the buffer u+1's reduction gave back, once u's gradients
// took u's memory; its all_gather does not overlap u's backward). Either
// way plus autograd's own gradients of one unit until they are copied.
//
// Who calls what. Every rank of the process group constructs it with the
// same units, runs the same forwards (forward() of the same units, in the
// same order) and one backward per iteration, and calls step(): the
// gathers and reductions inside them are collectives. The order of the
// first forward is the prefetch order: from the first backward on,
// forward(u) prefetches the unit the first forward ran after u, and the
// backward prefetches the one before, when backward_prefetch says (the
// first forward prefetches none). Every rank passes the same
// backward_prefetch: the constructor all-gathers the ranks' values (one
// word each) and every rank throws ValueError when they differ.
// Collective: the constructor (that all_gather, then ShardedUnits
// broadcasts rank 0's values),
// forward() (one all_gather of a unit not prefetched), the backward of a
// loss computed from forward()'s outputs, state_dict(), full_parameters().
// Local: step(), load_state_dict(), load_full_parameters(), the accessors.
//
// Threads and who waits. One thread per rank calls every method and runs
// the backward (a CPU backward runs its hooks on the calling thread).
// forward() waits for the unit's all_gather (its prefetch, when one was
// posted); the hook on the output's gradient waits for the unit's
// all_gather before the unit's backward (and, with before_backward,
// prefetches the unit before it); once every parameter of a unit
// has its gradient (hooks on their AccumulateGrad nodes) the unit is
// released into its gradients (release_for_gradients waits for the later
// unit's reduction), the unit before it is prefetched (after_gradients;
// with before_backward it is in flight already), the gradients are
// copied into the released memory and reduced there
// (reduce_gradients_async), and the full gradients are dropped (p.grad()
// stays undefined); a unit whose gradients arrive while it is not gathered
// has them copied into a buffer of their own. At the end of the backward (a
// callback queued on torch's autograd engine) the units the backward did
// not reach are reduced as zeros, the last reduction is waited for and
// every unit is freed: when backward() returns, no unit is gathered. Not
// under dopt::simulate's deterministic mode: its ranks are fibers of one
// thread, and torch's autograd keeps per-thread state (grad mode, the
// running backward) that a rank waiting inside a hook would leave to the next.
//
// Errors a caller can cause (dopt::Error subclasses naming the call,
// "FullyShard" for the constructor or "FullyShard.<call>", and the rank):
// no units, a null unit, a unit without trainable parameters, a parameter
// in two units, a backward_prefetch that is none of the enum's values, or
// that is not the same on every rank (ValueError on every rank, naming each
// rank's value); parameters
// that are not float32 CPU tensors (TypeError); a unit index out of range
// (ValueError); a second backward before step(), step() without a finished
// backward since the last step, forward() inside a backward (StateError);
// ShardedUnits' own (an optimizer that is not elementwise, redundancy > 0:
// NotSupportedError; a state dict of another layout: StateDictError).
// An exception inside the backward (a hook's collective failing) leaves
// the ranks' collectives out of step: drop the object.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/runtime/state_dict.hpp"

namespace dopt::libtorch {

/// When the backward posts the all_gather of the unit before u (in forward
/// order); torch FSDP's BackwardPrefetch. Memory: see "Memory" above.
enum class BackwardPrefetch {
  /// From the hook on u's output gradient, before u's backward runs: the
  /// gather overlaps u's backward (torch's BACKWARD_PRE); three unit buffers.
  before_backward,
  /// Once u's gradients took u's gathered memory: the gather overlaps u's
  /// reduction only (torch's BACKWARD_POST); two unit buffers.
  after_gradients,
};

/// ShardedUnits' options plus FullyShard's own; converts from
/// ShardedUnitsOptions (backward_prefetch then keeps its default).
struct FullyShardOptions : optim::ShardedUnitsOptions {
  FullyShardOptions() = default;
  FullyShardOptions(optim::ShardedUnitsOptions sharded)  // NOLINT(google-explicit-constructor): on purpose
      : optim::ShardedUnitsOptions(std::move(sharded)) {}
  BackwardPrefetch backward_prefetch = BackwardPrefetch::before_backward;
};

class FullyShard {
 public:
  /// Collective. units: the modules whose trainable parameters are
  /// gathered together (e.g. the children of a Sequential that have
  /// parameters), in the order their parameters appear in state_dict().
  FullyShard(std::vector<std::shared_ptr<torch::nn::Module>> units, optim::OptimizerSpec spec,
             FullyShardOptions options);
  FullyShard(std::vector<std::shared_ptr<torch::nn::Module>> units, const optim::OptimizerOptions& optimizer,
             FullyShardOptions options);
  /// Removes the hooks; the parameters stay empty (full_parameters() first
  /// to keep their values).
  ~FullyShard();
  FullyShard(const FullyShard&) = delete;
  FullyShard& operator=(const FullyShard&) = delete;

  /// Collective: gathers `unit` (waiting for its prefetch), prefetches the
  /// next unit, runs fn (the unit's forward; its result must be computed
  /// from the unit's parameters), frees the unit and, when grad mode is on
  /// and the result requires grad, hooks the result's gradient to gather
  /// the unit again before its backward.
  at::Tensor forward(std::size_t unit, const std::function<at::Tensor()>& fn);
  /// Runs a Sequential's children in order on x: a child that is a unit
  /// through forward(unit, ...), the others directly.
  at::Tensor forward(torch::nn::Sequential net, at::Tensor x);

  /// Local: steps this rank's shards with the averaged gradients of the last
  /// backward (StateError without one since the last step).
  void step();

  /// Collective: the consolidated state dict, torch's layout (one group;
  /// index i is parameters()[i]), on every rank.
  StateDict state_dict();
  /// Local: loads a consolidated state dict (state_dict()'s layout, or a
  /// torch optimizer's or ZeroRedundancyOptimizer's over parameters()).
  void load_state_dict(const StateDict& sd);
  /// Collective: every parameter in full (copies), in parameters()' order.
  std::vector<at::Tensor> full_parameters();
  /// Local, between iterations: sets the parameters from full values (in
  /// parameters()' order; each rank keeps its shards).
  void load_full_parameters(const std::vector<at::Tensor>& full);

  /// The sharded torch parameters, unit by unit (empty between gathers).
  std::vector<at::Tensor> parameters() const;
  std::size_t num_units() const noexcept;
  /// Bytes this rank keeps between iterations (ShardedUnits::bytes()).
  std::int64_t bytes() const;
  /// Bytes of full parameters held now (ShardedUnits::gathered_bytes();
  /// the torch parameters hold no memory of their own): 0 after step().
  std::int64_t gathered_bytes() const;
  /// The ShardedUnits underneath (register_comm_hook, optim()).
  optim::ShardedUnits& sharded() noexcept;
  int rank() const noexcept;
  BackwardPrefetch backward_prefetch() const noexcept;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // the hooks hold weak references
};

}  // namespace dopt::libtorch
