#pragma once
// dopt::optim::Reducer: the gradient reducer of torch's
// DistributedDataParallel, for trainers that compute their own gradients
// (no autograd here). It averages gradients over a process group bucket by
// bucket, overlapping communication with the rest of the backward pass.
//
//   Reducer reducer(params, ctx.world());                // collective (broadcast from rank 0)
//   for (...) {
//     for (each param p, as its gradient becomes ready) { p.set_grad(g); reducer.mark_ready(p); }
//     reducer.finalize();                                 // waits; p.grad() = average over ranks
//     opt.step();
//   }
//
// Buckets (torch 1.13 DDP): the parameters are assigned in registration order
// to per-dtype buckets; a bucket closes once it holds at least its limit in
// bytes (first_bucket_cap_bytes for a dtype's first bucket, bucket_cap_bytes
// after); the buckets are sorted by their first parameter and then the list
// is reversed, so bucket 0 holds the *last* registered parameters, whose
// gradients a backward pass produces first. Inside a bucket the parameters
// keep registration order. bucket_indices() shows the assignment.
//
// Per synchronised iteration, on every rank of the group:
//   mark_ready(p) once per parameter, in any order: copies p.grad() (zeros if
//     undefined) into its bucket. When every parameter of a bucket is ready,
//     the buckets that are now ready *in index order* are launched at once:
//     the comm hook (default allreduce_hook(group)) is called on the bucket
//     and its future kept (with overlap = false, buckets launch in finalize).
//   finalize(): launches what is left, waits for every bucket in index order
//     and writes the reduced values into the parameters' grads (creating
//     them when undefined). Then the next iteration may begin.
// Every rank must mark the same parameters each iteration (their order may
// differ between ranks; the launch order is always bucket order), so every
// rank runs the same collectives. With find_unused_parameters, finalize
// first marks every parameter not marked yet, with a zero gradient; without
// it, a parameter left unmarked at finalize() is a StateError naming it.
//
// no_sync(): while the returned guard lives, iterations are local: mark_ready
// only checks its argument, finalize() only resets, no communication. The
// trainer accumulates gradients in p.grad() itself; the first synchronised
// iteration after it reduces the accumulated gradients (DDP's no_sync).
//
// Join (join.hpp): the reducer is a Joinable. Its first mark_ready of each
// synchronised iteration calls Join::notify_join_context(*this). A joined
// rank's hook runs, per shadowed iteration, the comm hook over zero buckets
// in bucket order and waits for them (torch's _match_all_reduce_for_bwd_pass);
// averages then count joined ranks as zeros, divided by the full group size
// (torch's divide_by_initial_world_size=True). Its post hook does nothing
// (torch's broadcast of the final model from the last joiner is not done).
//
// Errors: mark_ready of a parameter that was not registered (ValueError) or
// marked twice in one iteration (StateError); a gradient of the wrong shape
// or dtype (ShapeError/DTypeError); a second register_comm_hook or one after
// the first iteration began (StateError); duplicate or undefined parameters,
// parameters on different devices, non-floating parameters, an invalid group, a zero bucket cap
// (ValueError / TypeError) at construction. A hook's or a collective's
// failure is rethrown by finalize().
//
// Devices: the parameters may live on any one device (all on the same; CUDA
// after gpu::init()). The buckets are allocated there, gradients are copied
// into them and back with device copies, the built-in hooks divide and cast
// there (the device ops gpu/ registers: bitwise the CPU arithmetic) and
// their all-reduces go to the device backend (NCCL: NCCL's summation order,
// as torch's DDP on CUDA). Join's own all-reduces stay on the CPU
// (join_device()). The CPU path is unchanged.
//
// Surviving a lost rank (ReducerOptions::survive; docs/fault-tolerance-optimizers.md):
// each bucket's local gradients are kept (one copy of the buckets) when it is
// launched. When finalize() finds a bucket failed with PeerLostError, every
// survivor shrinks the reducer's group (ProcessGroup::shrink()), checks that
// the survivors stopped in the same iteration, and reduces *every* bucket of
// that iteration again from its kept local gradients over the survivors'
// group (the default hook: divided by the survivors' count): the iteration's
// gradients are the survivors' average whichever buckets had completed, and
// the lost rank's contribution is dropped from all of them. finalize() then
// calls on_membership_change(recovery) and returns, or, without a callback,
// throws MembershipChangedError (recovery.hpp) carrying it; either way the
// gradients are written and the reducer runs over recovery.group from now
// on. A loss that finalize() does not see (elsewhere in the trainer):
// recover() on every survivor, between iterations. survive needs the default
// comm hook (register_comm_hook is NotSupportedError: a hook's state holds
// the old group); no_sync() and Join are not recovered.
//
// ZeRO stage 2 (ReducerOptions::gradient_owners, which zero_stage2_options in
// zero.hpp fills from a ZeroRedundancyOptimizer's partition; docs/zero-stage2-3.md,
// "Stage 2"): the reducer shards the gradients by owner. Inside each
// bucket the parameters are ordered by owner (then registration order), so
// each owner's gradients are one contiguous segment. A launched bucket goes
// to the hook with these segments as its GradBucket::owner_segments(): the
// default allreduce_hook and the compress hooks divide by the group size
// and reduce each segment onto its owner (ProcessGroup::reduce: group-rank
// order, bitwise the all_reduce's sums, so the owner's averages are stage
// 1's with the same hook, bit for bit); a hook that all-reduces the whole
// bucket stays correct. Only the owned part is kept. mark_ready drops p.grad() of a
// parameter this rank does not own once it is copied into its bucket. A
// bucket gets a buffer at its first mark_ready: a spare one when there is
// one; else, while two buffers are in use and a launched bucket is still
// reducing, mark_ready waits for the oldest such bucket, writes its owned
// averages and reuses its buffer; else a new one. finalize() writes the
// averages of the owned parameters left (the others have no gradient
// afterwards) and keeps one spare buffer, the largest: between iterations
// the rank holds its owned gradients and one bucket (gradient_bytes()). ZeroRedundancyOptimizer::step() then steps the owned
// parameters and broadcasts them (stage 1's step, unchanged). no_sync() and
// Join work as above (a joined rank's shadow iteration reduces zero buckets
// onto their owners). survive with owners: NotSupportedError at construction
// (a recovery would need every rank's averages).
//
// Not thread-safe: one thread per rank calls every method.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/join.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/recovery.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim {

/// A plain aggregate, as the other options structs:
/// ReducerOptions{.bucket_cap_bytes = 4 << 20, .overlap = false}.
struct ReducerOptions {
  /// torch's bucket_cap_mb = 25.
  std::size_t bucket_cap_bytes = 25u * 1024u * 1024u;
  /// torch's dist._DEFAULT_FIRST_BUCKET_BYTES.
  std::size_t first_bucket_cap_bytes = 1024u * 1024u;
  /// Launch a bucket as soon as it is ready (false: all at finalize()).
  bool overlap = true;
  /// finalize() marks the parameters not marked yet (zero gradient).
  bool find_unused_parameters = false;
  /// The constructor broadcasts every parameter from group rank 0 (DDP's
  /// initial module-state sync), one broadcast per parameter in order.
  bool broadcast_parameters = true;
  /// Survive a lost rank (see the header): keeps a copy of each bucket's
  /// local gradients per iteration. dopt only.
  bool survive = false;
  /// survive: called on every survivor when finalize() recovered (then it
  /// returns normally). Empty: finalize() throws MembershipChangedError.
  std::function<void(const ZeroRecovery&)> on_membership_change = {};
  /// ZeRO stage 2 (see the header): the owner (group rank) of each parameter,
  /// by registration index, the same on every rank; zero_stage2_options
  /// (zero.hpp) fills it from the optimizer's partition. One per parameter,
  /// each in [0, group size) (ValueError otherwise). Empty: every rank gets
  /// every averaged gradient (DDP).
  std::vector<int> gradient_owners = {};
};

class Reducer : public Joinable {
 public:
  /// Registers params (registration order = their order here). A collective
  /// over process_group when options.broadcast_parameters.
  Reducer(std::vector<Tensor> params, ProcessGroup process_group, ReducerOptions options = {});
  ~Reducer() override;
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Replaces the default allreduce_hook; once, before the first iteration.
  void register_comm_hook(CommHook hook);

  /// The gradient of `param` (p.grad()) is ready; see the header.
  void mark_ready(const Tensor& param);
  /// Completes the iteration; see the header.
  void finalize();
  /// survive: after a PeerLostError outside finalize() (between iterations),
  /// a collective of the survivors: shrinks the group, checks that they
  /// stopped after the same iteration, and runs over the survivors' group
  /// from now on. No gradients are reduced (step_completed = false).
  /// `shrunk`: the survivors' group when the trainer already shrank this
  /// reducer's group (then no second shrink). StateError without survive.
  ZeroRecovery recover(std::optional<ProcessGroup> shrunk = std::nullopt);

  /// RAII guard of no_sync(); restores the previous mode when destroyed.
  class NoSync {
   public:
    explicit NoSync(Reducer& r) : r_(&r), prev_(r.require_sync_) { r.require_sync_ = false; }
    ~NoSync() { if (r_) r_->require_sync_ = prev_; }
    NoSync(NoSync&& o) noexcept : r_(o.r_), prev_(o.prev_) { o.r_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    Reducer* r_;
    bool prev_;
  };
  /// Local iterations while the guard lives (DDP's no_sync context).
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  bool require_sync() const noexcept { return require_sync_; }

  /// Parameter indices (registration order) of each bucket, bucket order.
  std::vector<std::vector<std::size_t>> bucket_indices() const;
  std::size_t num_buckets() const noexcept { return buckets_.size(); }
  const std::vector<Tensor>& parameters() const noexcept { return params_; }
  /// Synchronised iterations finalized so far.
  std::int64_t num_iterations() const noexcept { return iterations_; }
  /// Buckets launched in the current iteration.
  std::size_t num_launched() const noexcept { return next_launch_; }
  const ProcessGroup& process_group() const noexcept { return group_; }
  /// ZeRO stage 2: ReducerOptions::gradient_owners (empty: DDP).
  const std::vector<int>& gradient_owners() const noexcept { return owner_of_; }
  /// Bytes this rank holds for gradients now: the defined p.grad() of the
  /// registered parameters, the bucket buffers and survive's copies. Between
  /// iterations: the full gradients plus every bucket in stage 1, the owned
  /// gradients only in stage 2.
  std::int64_t gradient_bytes() const;

  // Joinable
  std::unique_ptr<JoinHook> join_hook() override;
  Device join_device() const override { return Device::cpu(); }
  ProcessGroup join_process_group() const override { return group_; }

 private:
  struct Bucket {
    std::vector<std::size_t> params;      // registration indices
    std::vector<std::int64_t> offsets;    // element offsets in buffer
    Tensor buffer;                        // 1-D, bucket dtype
    std::size_t pending = 0;              // params not yet marked this iteration
    Future<Tensor> result;
    Tensor saved;                         // survive: the local gradients as launched
    // stage 2: each owner's contiguous segment of buffer (the hook's owner segments)
    std::vector<GradBucket::Segment> segments;
    std::int64_t numel = 0;
    Tensor storage;        // stage 2: the pooled buffer that `buffer` views
    bool written = false;  // stage 2: its averages are written this iteration
  };
  friend class ReducerJoinHook;

  void launch(std::size_t b);
  void launch_ready();
  /// stage 2: ReducerOptions::gradient_owners' rules (the constructor's).
  void check_gradient_owners() const;
  /// stage 2 (ddp/reducer_stage2.cpp): gives the bucket a buffer (see the header).
  void ensure_buffer(Bucket& bucket);
  /// stage 2: when the bucket's reduction succeeded (waiting for it), writes
  /// its owned averages and puts its buffer back among the spares.
  bool harvest(Bucket& bucket);
  /// stage 2: the bucket's buffer back among the spares.
  void release_buffer(Bucket& bucket);
  /// stage 2, between iterations: keeps the largest spare only.
  void trim_spares();
  /// Writes a bucket's reduced values into the gradients (stage 2: the owned ones).
  void write_bucket(Bucket& bucket, const Tensor& reduced, const char* op);
  void reset_iteration();
  /// Runs the hook over zero buckets (a joined rank's shadow iteration).
  void shadow_iteration();
  /// survive: the iteration's buckets again over the survivors (header).
  ZeroRecovery recover_in_finalize();
  /// Waits for every bucket and writes the reduced values into the grads.
  std::exception_ptr write_results(const char* op);

  std::vector<Tensor> params_;
  ProcessGroup group_;
  ReducerOptions options_;
  CommHook hook_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const TensorImpl*, std::size_t> index_of_;
  std::vector<std::size_t> bucket_of_;  // by registration index
  std::vector<std::size_t> slot_of_;    // position inside its bucket
  std::vector<bool> marked_;
  std::size_t num_marked_ = 0;
  std::size_t next_launch_ = 0;
  bool require_sync_ = true;
  bool in_iteration_ = false;
  bool started_ = false;
  std::int64_t iterations_ = 0;
  Future<void> join_notify_;
  std::vector<int> owner_of_;  // stage 2 when not empty: owner by registration index
  bool stage2_ = false;
  std::vector<Tensor> spares_;       // stage 2: bucket buffers not in use
  std::size_t buffers_in_use_ = 0;   // stage 2: buckets holding a buffer
  bool shadowing_ = false;           // a joined rank's shadow iteration: nothing is written
};

}  // namespace dopt::optim
