#pragma once
// dopt::optim::ShardedUnits: ZeRO stage 3, sharded parameters, for trainers
// that write their own forward and backward (no autograd here), as
// dopt-train does. docs/zero-stage2-3.md explains the stages and what each
// holds per parameter.
//
//   ShardedUnits model(units, AdamOptions(1e-3), ShardedUnitsOptions{ctx.world()});
//   for (...) {
//     for (u = 0 .. U-1) {                           // forward
//       auto full = model.gather(u);                 // waits for the prefetched all_gather
//       if (u + 1 < U) model.prefetch(u + 1);        // overlaps the next unit's all_gather
//       ... compute with full ...; model.release(u);
//     }
//     for (u = U-1 .. 0) {                           // backward
//       auto full = model.gather(u); if (u > 0) model.prefetch(u - 1);
//       ... grads of unit u ...; model.reduce_gradients(u, grads); model.release(u);
//       // or, without a copy: auto g = model.gradient_buffers(u); ... write g ...;
//       //                     model.reduce_gradients_async(u);
//     }
//     // or, two unit buffers instead of three (the parameters' memory takes the gradients):
//     //   auto full = model.gather(u); ... what needs full (the input's gradient) ...;
//     //   auto g = model.release_for_gradients(u); if (u > 0) model.prefetch(u - 1);
//     //   ... write g (the parameters' gradients) ...; model.reduce_gradients_async(u);
//     model.step();                                  // local: this rank's shards
//   }
//
// A unit is a group of parameters (a layer, say), flattened in order and
// padded with zeros to a multiple of the group size N: rank r keeps elements
// [r*S, (r+1)*S) of it (S = ceil(numel / N)), the shard's gradient and the
// optimizer's state of the shard. The full parameters exist only while a
// unit is gathered.
//
// Collective contract. Collectives over the process group: every rank calls
// them, in the same order, with the same unit: the constructor (a broadcast
// of each unit from group rank 0 when broadcast_parameters), gather(),
// gather_async() and prefetch() of a unit that is released (one all_gather;
// of a unit gathered or in flight they are local and post nothing),
// reduce_gradients() and reduce_gradients_async() (one reduce per rank's
// shard, or the comm hook), state_dict() and full_parameters() (all_gathers),
// save_sharded() (ends with an all_reduce of the ranks' write failures).
// Local: release(), gradient_buffers(), release_for_gradients(), step(), load_state_dict(), load_parameters(),
// shard_state_dict(), load_sharded(), the accessors. Nothing is thread-safe: one thread per rank calls every method.
//
// Who waits: gather() waits for its all_gather; gather_async()/prefetch()
// return at once and the future completes (on a runtime thread) once the
// full parameters are in place; gather() of a prefetched unit waits for that
// future. reduce_gradients() waits for its reduces and writes this rank's
// averaged shard; reduce_gradients_async() first waits for the reduction
// still in flight (one at most: one unit's gradient buffer), then returns
// once the unit's gradients are copied (the caller may drop them); the
// shard's grad() holds the average when its future completes. Without a
// copy: gradient_buffers(u) waits for the reduction in flight and hands out
// the reduce buffer's views; reduce_gradients(_async)(u) reduce it in place
// (the views are the reduction's from then on). release_for_gradients(u)
// waits for u's all_gather if in flight and for the reduction in flight
// (its buffer serves the next gather). step() waits
// for the reduction in flight. release() of a unit in flight waits for its
// all_gather (every rank posted it).
//
// Arithmetic (bit for bit stage 1, ZeroRedundancyOptimizer with a Reducer):
// reduce_gradients divides the unit's flat gradient by N and reduces each
// rank's shard onto that rank (ProcessGroup::reduce: group-rank order, the
// all_reduce's sums), so each element's average is the all_reduce's;
// step() runs the optimizer elementwise on the shard, which is stage 1's
// step of those elements. With a registered comm hook (fp16_compress_hook,
// ...) the hook runs over the whole unit, as the Reducer runs it over a
// bucket, with the ranks' shards as its owner segments (the built-in hooks
// reduce each shard onto its rank), and only this rank's shard is kept. Elementwise optimizers only
// (SGD, Adam, AdamW, Adagrad, RMSprop, Adamax, Adadelta, Rprop, NAdam,
// RAdam): any other (Muon, whose step needs whole matrices) is a
// NotSupportedError at construction; use stage 1 or 2 for it.
//
// Errors a caller can cause (dopt::Error subclasses naming the call and the
// rank): an empty unit list or unit, undefined parameters, a parameter in
// two units (ValueError); non-float32 or non-CPU parameters (TypeError);
// redundancy > 0 and optimizers that are not elementwise
// (NotSupportedError); a unit index out of range (ValueError); gradients of
// the wrong count or shape (ShapeError) or not float32 on the CPU
// (DTypeError); a second reduce_gradients of a unit in one iteration,
// gradient_buffers of a reduced unit, reduce_gradients(u) without
// gradient_buffers(u) or release_for_gradients(u), the copying
// reduce_gradients while u's buffers are out, release_for_gradients of a
// unit that is not gathered, reduced, or whose gradient_buffers are out,
// step()
// before every unit's gradients were reduced, a second register_comm_hook
// or one after the first reduction (StateError). A collective's failure is
// rethrown by the call that waits for it.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/zero.hpp"  // ShardLoadReport
#include "dopt/optim/optimizer.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim {

namespace stage3_detail {
struct Access;  // the Checkpointer's snapshot of the shards (not installed)
}  // namespace stage3_detail

/// A plain aggregate: ShardedUnitsOptions{ctx.world()}.
struct ShardedUnitsOptions {
  ProcessGroup process_group;
  /// The constructor broadcasts every unit from group rank 0 before
  /// sharding it (the Reducer's initial sync); false: every rank passes the
  /// same values.
  bool broadcast_parameters = true;
  /// Buddies that keep other ranks' shards (stage 1's redundancy): not
  /// supported in stage 3; > 0 is a NotSupportedError at construction.
  int redundancy = 0;
};

class ShardedUnits {
 public:
  /// Collective (see the header). Takes each unit's parameters (their values;
  /// only this rank's shard is kept: units moved in are freed unit by unit
  /// as they are sharded, when the caller holds no other reference).
  ShardedUnits(std::vector<std::vector<Tensor>> units, OptimizerSpec spec, ShardedUnitsOptions options);
  ShardedUnits(std::vector<std::vector<Tensor>> units, const OptimizerOptions& optimizer,
               ShardedUnitsOptions options);
  /// Waits for the collectives in flight (their errors are dropped).
  ~ShardedUnits();
  ShardedUnits(const ShardedUnits&) = delete;
  ShardedUnits& operator=(const ShardedUnits&) = delete;

  /// The full parameters of `unit` (views of one gathered buffer, the
  /// original shapes), until release(unit). Collective when released.
  std::vector<Tensor> gather(std::size_t unit);
  /// As gather(), without waiting: the future yields the parameters.
  Future<std::vector<Tensor>> gather_async(std::size_t unit);
  /// gather_async() whose result is taken later by gather(unit).
  Future<void> prefetch(std::size_t unit);
  /// Local: gives the gathered buffer back; the views gather() returned
  /// must not be used after it (a later gather reuses their memory). A
  /// released unit: nothing.
  void release(std::size_t unit);

  /// Replaces the default (divide, reduce each shard onto its rank) by a
  /// comm hook over the unit's whole flat gradient; once, before the first
  /// reduction (StateError otherwise).
  void register_comm_hook(CommHook hook);
  /// Collective: `grads` are this rank's gradients of the unit's parameters,
  /// in order (an undefined one counts as zeros); this rank keeps the
  /// average over the group of its shard. Once per unit per iteration.
  void reduce_gradients(std::size_t unit, const std::vector<Tensor>& grads);
  /// As reduce_gradients; see the header for who waits.
  Future<void> reduce_gradients_async(std::size_t unit, const std::vector<Tensor>& grads);

  /// Local: views, in the parameters' shapes, of the buffer that
  /// reduce_gradients(unit) reduces in place, zeros at first (a view the
  /// caller leaves unwritten counts as zeros), so the backward writes the
  /// unit's gradients there and nothing is copied. Waits for the reduction
  /// in flight, if any (it holds the buffer); call it when the gradients are
  /// about to be written, after the unit's compute, to keep that reduction
  /// overlapped. A second call before the reduction returns views of the
  /// same buffer (its values kept). The views may be written until
  /// reduce_gradients(unit) / reduce_gradients_async(unit) is called and
  /// must not be used after it: the reduction writes them, and the next
  /// unit's buffers reuse their memory (not detected). StateError for a
  /// unit reduced already in this iteration.
  std::vector<Tensor> gradient_buffers(std::size_t unit);
  /// Local: gives the memory of the unit's gathered parameters to its
  /// gradients and returns views of it in the parameters' shapes, zeros, as
  /// gradient_buffers(unit) would, without a buffer of their own: for a
  /// backward whose parameter gradients need no parameters once the input's
  /// gradient is computed (a linear layer's dW = dY^T X). The views gather()
  /// returned must not be used after it: the unit is released (a later
  /// gather fetches it again). Waits for the unit's all_gather when in
  /// flight (its error is rethrown, the buffer dropped), then for the
  /// reduction in flight, if any, whose buffer serves the next gather: call
  /// prefetch(unit - 1) after it and a rank holds two unit buffers in the
  /// backward (the reduction in flight overlaps the compute before this
  /// call, the prefetch the compute after it). A second call before the
  /// reduction returns views of the same buffer (its values kept), as does
  /// gradient_buffers(unit) after it. StateError for a unit that is not
  /// gathered (nor in flight), one reduced already in this iteration, or
  /// one whose gradient_buffers(unit) were taken (a buffer of their own).
  std::vector<Tensor> release_for_gradients(std::size_t unit);
  /// Collective: reduce_gradients of the values written into
  /// gradient_buffers(unit) or release_for_gradients(unit), in place (bit
  /// for bit the copying overload). StateError when neither was taken in
  /// this iteration or the unit was reduced already; the copying overloads
  /// are a StateError while the unit's buffers are out.
  void reduce_gradients(std::size_t unit);
  /// As reduce_gradients(unit); returns once the reduction is posted (after
  /// waiting for another unit's reduction in flight, if any).
  Future<void> reduce_gradients_async(std::size_t unit);

  /// Local: steps this rank's shards (after every unit's reduce_gradients of
  /// the iteration; StateError otherwise) and starts the next iteration.
  /// Waits for the gathers in flight and releases every gathered unit (its
  /// values are the old ones): the next gather fetches the new values.
  void step();

  /// Collective: the consolidated state dict, torch's layout (one group,
  /// global index = position in the units' order, per-element state in the
  /// parameter's shape), on every rank; CPU tensors.
  StateDict state_dict();
  /// Local: loads a consolidated state dict (from state_dict() or a
  /// ZeroRedundancyOptimizer's / torch optimizer's over the same parameters
  /// in one group); keeps this rank's shard of each state tensor.
  /// StateDictError for another layout; nothing changes when it throws.
  void load_state_dict(const StateDict& sd);
  /// Collective: writes this rank's shards (parameters and optimizer state)
  /// to dir/shard_file_name(rank(), world_size()) (dir is created); every
  /// rank learns whether all were written (IOError otherwise). `metadata` is
  /// added to the file's; ValueError for a key that starts with "dopt.zero3.".
  void save_sharded(const std::string& dir, const std::map<std::string, std::string>& metadata = {});
  /// Local: this rank's shards as save_sharded writes them (copies: training
  /// may go on while another thread saves them with save_state_dict).
  StateDict shard_state_dict(const std::map<std::string, std::string>& metadata = {}) const;
  /// Local: loads shards written by save_sharded at any world size (this
  /// rank reads the files that hold its new part of each unit). IOError for
  /// a folder with missing files or several world sizes; StateDictError for
  /// other units, another optimizer, or files of different steps (the odd
  /// file named). Nothing changes when it throws. Waits for the gathers in
  /// flight and releases every gathered unit.
  ShardLoadReport load_sharded(const std::string& dir);
  /// "units-rank{r}-of-{N}.safetensors".
  static std::string shard_file_name(int rank, int world_size);
  /// Collective: every parameter in full (copies), in the units' order.
  std::vector<Tensor> full_parameters();
  /// Local: sets the parameters from full values (in the units' order);
  /// waits for the gathers in flight and releases every gathered unit.
  void load_parameters(const std::vector<Tensor>& full);

  std::size_t num_units() const noexcept;
  /// Elements of `unit` (without padding) and of its shard.
  std::int64_t unit_numel(std::size_t unit) const;
  std::int64_t shard_numel(std::size_t unit) const;
  /// Bytes this rank keeps between iterations: the parameter shards, their
  /// gradients and the optimizer's state (16/N B per float32 parameter with
  /// Adam, plus padding).
  std::int64_t bytes() const;
  /// Bytes of the gather buffers now: the gathered (or in flight) units'
  /// full parameters and the released one kept for the next gather (two
  /// units in the loop of the header; 0 after step()).
  std::int64_t gathered_bytes() const;
  /// Bytes of every unit-sized buffer now: gathered_bytes() and the gradient
  /// buffers (handed out, under reduction, or kept for the next reduction).
  /// Three units at most in the header's backward with gradient_buffers,
  /// two with release_for_gradients before the prefetch; 0 after step().
  std::int64_t buffer_bytes() const;
  /// This rank's shard of `unit` (1-D; its grad() after reduce_gradients).
  const Tensor& shard(std::size_t unit) const;
  Optimizer& optim() noexcept;
  const Optimizer& optim() const noexcept;
  const ProcessGroup& process_group() const noexcept;
  int rank() const noexcept;
  int world_size() const noexcept;

 private:
  friend struct stage3_detail::Access;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dopt::optim
