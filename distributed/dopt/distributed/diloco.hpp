#pragma once
// DiLoCo and Streaming DiLoCo: an averager that runs an outer optimizer on
// the averaged pseudo-gradient, for PostLocalSGDOptimizer (docs/diloco.md).
//
//   auto inner = std::make_unique<AdamW>(params, AdamWOptions(1e-3));
//   DiLoCoOptions o;                       // outer: SGD(lr 0.7, momentum 0.9, nesterov)
//   o.sync_every = 100;
//   auto diloco = std::make_unique<DiLoCoAverager>(inner->all_params(), o, ctx.world());
//   PostLocalSGDOptimizer opt(std::move(inner), std::move(diloco));
//   for (...) { ...gradients...; opt.step(); opt.zero_grad(); }
//
// The algorithm (torchft's DiLoCo / Streaming DiLoCo; F fragments,
// H = sync_every / F, D = fragment_sync_delay, alpha = fragment_update_alpha).
// average_parameters() is called once after every inner step; call c
// (0-based) belongs to round q = c / H and works on fragment k = q mod F:
//  - prepare, at the call with c % H + 1 == H - D: for every parameter i of
//    fragment k, delta_i = anchor_i - param_i; the average of the deltas over
//    the group is started (asynchronously: it overlaps the next D inner steps);
//  - sync, at the call with c % H + 1 == H: the average is waited for; the
//    fragment's outer optimizer steps its anchors with the averaged delta as
//    their gradient; then param_i <- lerp(anchor_i, param_i, alpha) (alpha 0:
//    the new global value; 1: keep the local value).
// The anchors start as the parameters' values at construction. The outer
// optimizers (one per fragment, built from `outer_optimizer` through the
// registry) own the anchor tensors: their state is keyed by them.
// Averaging: sum over the ranks, then divide by the group size (torchft's
// order; PeriodicModelAverager divides first). With outer SGD(lr = 1, no
// momentum), F = 1, D = 0, alpha = 0 this computes PeriodicModelAverager's
// average (up to that rounding) at the calls H - 1, 2H - 1, ...
//
// Wire formats (DiLoCoOptions::wire_format): float32 (the default) sends each
// delta in its parameter's dtype through one all_reduce_coalesced per dtype,
// summed in gloo's ring order (bitwise torch/torchft on gloo for float32);
// bfloat16, float16, int8 (per-row scales), int4 go through
// quantized_all_reduce (quantized_all_reduce.hpp: a reduce-scatter of
// quantized chunks, a float32 reduction, an all-gather of the re-quantized
// result) of the fragment's deltas as one float32 buffer, on a worker thread
// of this averager; with error_feedback each rank keeps what quantization
// lost of its deltas and adds it at the next sync of that fragment.
//
// Collective contract: every rank of the group constructs the averager alike
// (same parameter shapes and dtypes, same options) and calls
// average_parameters once per inner step (PostLocalSGDOptimizer::step and
// skip_step do). Prepare calls start a collective over the group; sync calls
// wait for it. The float32 format takes the group's collective sequence
// numbers at the prepare call on the calling thread, so other collectives may
// be issued on the group meanwhile (in the same order on every rank); the
// quantized formats talk point to point on the tags wire_tag and wire_tag + 1
// only. Not thread-safe: one thread per rank at a time. The parameters must
// not be replaced (set_data) while the averager holds them.
//
// Growing back (docs/growing-back.md): after the group
// grew, PostLocalSGDOptimizer's post_local_sgd_catch_up moves this averager
// onto the grown group (take_grown_group below: a fragment in flight is
// completed over the old group first) and sends its state to the newcomers.
//
// Failure: when the average fails (a lost peer: PeerLostError naming it; a
// timeout), the sync call resets the fragment's parameters to their anchors
// (the local progress since the last sync of that fragment is dropped),
// keeps the anchors and the outer state, and rethrows. The schedule depends
// only on the call counter, so the failed fragment is next synchronised at
// its next turn. How a trainer recovers: docs/diloco.md.
//
// Async (average_parameters_async, PostLocalSGDOptimizer::step_async): the
// same call, but a sync call returns before the average arrived: the wait,
// the outer step and the parameter update run on the thread that completes
// the average (a runtime thread for float32, this averager's worker for the
// quantized formats), and the returned future completes after them, carrying
// the average's error (the fragment then back at its anchors, as above).
// Bitwise the blocking form's result: both run the same completion code,
// the blocking form on the calling thread. Until that future is ready the fragment's parameters are not
// final (reading them races the update); every call of this averager waits
// for it first (a documented wait; the error is not thrown again: the
// failed fragment is at its anchors and synchronises at its next turn),
// except the accessors (options(), params(), fragments(), anchors(),
// outer_optimizer(), pending_fragment(), stats()), which must not be called
// while it is in flight.
//
// State: save_state()/load_state() put the anchors, the outer optimizers'
// state, the error-feedback residuals and an average in flight (waited for)
// into the state dict of PostLocalSGDOptimizer, under keys "diloco.*" of the
// parameters' entries and metadata "diloco.*"; a resumed run continues bit
// for bit. Each rank's dict holds the whole replicated state (anchors and
// outer state are the same on every rank), unless sharded checkpoints are
// chosen (set_sharded_checkpoints, save_sharded, load_sharded below).
// Parameters: CPU floating-point tensors (TypeError otherwise, at
// construction). fragment_update_alpha 0 copies the new global value (torch's
// lerp with weight 0 gives the same, except NaN where a local value is
// infinite).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/distributed/quantized_all_reduce.hpp"
#include "dopt/optim/registry.hpp"

namespace dopt::optim {

struct DiLoCoOptions {
  /// Inner steps between two synchronisations of the same fragment (torchft's sync_every).
  std::int64_t sync_every = 100;
  /// Fragments as lists of parameter indices (positions in the parameter
  /// list given to the constructor); together every index exactly once; the
  /// order inside a fragment is the order of its buffer and outer optimizer.
  /// Empty: one fragment holding every parameter in order.
  std::vector<std::vector<std::int64_t>> fragments;
  /// Inner steps the average of a fragment overlaps (tau): 0 <= D < sync_every / F.
  std::int64_t fragment_sync_delay = 0;
  /// 0: parameters take the new global value at a sync; 1: they keep the local one.
  double fragment_update_alpha = 0.0;
  /// The outer optimizer of every fragment (any registered one).
  OptimizerSpec outer_optimizer{"SGD", {{"lr", 0.7}, {"momentum", 0.9}, {"nesterov", true}}};
  WireFormat wire_format = WireFormat::float32;
  /// Quantized formats only: carry the quantization error to the next sync.
  bool error_feedback = false;
  /// int8/int4: elements per scale.
  std::int64_t row_size = 256;
  /// Quantized formats: the first of the two point-to-point tags.
  int wire_tag = 0x0D1C0;
};

/// What the averager has done (this rank), for reports and benchmarks.
struct DiLoCoStats {
  std::int64_t syncs = 0;         ///< completed synchronisations
  std::int64_t failed_syncs = 0;  ///< syncs that raised
  /// Bytes this rank sends for its averages, counted when each starts:
  /// quantized formats exactly (quantized_all_reduce_bytes), float32 as a
  /// ring all-reduce sends them (2 (n - 1) / n of the deltas' bytes).
  std::uint64_t bytes_sent = 0;
  double seconds_waiting = 0;     ///< time sync calls blocked on the average
  double seconds_preparing = 0;   ///< time prepare calls took (deltas, quantization, start)
};

class DiLoCoAverager : public ModelAverager {
 public:
  /// Checks the options (ValueError naming the field: sync_every < 1, a
  /// fragment list that is not a partition of the indices, an empty fragment,
  /// sync_every % F != 0, D out of range, alpha outside [0, 1], row_size < 1,
  /// an unknown outer optimizer) and builds one outer optimizer per fragment
  /// over the anchors. Local (no communication).
  DiLoCoAverager(std::vector<Tensor> params, DiLoCoOptions options, ProcessGroup process_group);
  ~DiLoCoAverager() override;

  /// One call per inner step (the groups are not read: the parameters are the
  /// constructor's). A collective on prepare and sync calls (header).
  void average_parameters(const std::vector<Tensor>& params) override;
  void average_parameters(const std::vector<OptimizerParamGroup>& groups) override;
  /// The same call with a sync's completion in the background (see the
  /// header); a ready future on calls that do not sync. Rank thread.
  Future<void> average_parameters_async(const std::vector<OptimizerParamGroup>& groups) override;

  /// The group on calls that prepare or sync a fragment.
  std::optional<ProcessGroup> group_for_step(std::int64_t step) const override;
  std::int64_t warmup_steps() const noexcept override { return 0; }

  void save_state(StateDict& sd) const override;
  void load_state(StateDict& sd) override;

  /// Growing back (diloco_grow.cpp; post_local_sgd_catch_up in
  /// post_local_sgd.hpp runs it on every rank of the grown group, before any
  /// state is sent). Rank thread, at a step boundary; a collective over
  /// `grown` (every rank of it calls, members and newcomers): first one
  /// all_gather of this averager's settings (sync_every, fragments,
  /// fragment_sync_delay, fragment_update_alpha, the outer optimizer with its
  /// defaults, the wire format's settings, the parameters' dtypes and
  /// shapes); when any rank's differs, every rank throws ValueError naming
  /// `op`, each differing setting, its values and the global ranks that have
  /// them, and nothing changed. A fragment in flight is supported: this call
  /// first waits for a sync completing in the background and for an average
  /// in flight, which was started over the old group and is completed over it
  /// (its sum divided by the old group's size: the members that prepared it).
  /// That averaged fragment then stays pending, goes to the newcomers with
  /// save_state, and every rank of the grown group applies it at the
  /// fragment's sync; the next prepare averages over `grown`. An average in
  /// flight that failed rethrows its error here (PeerLostError: shrink the
  /// group and grow again). `grown` invalid or without this rank: ValueError
  /// naming `op`.
  void take_grown_group(ProcessGroup grown, const char* op) override;

  /// Sharded checkpoints. With set_sharded_checkpoints(true), save_state
  /// (so PostLocalSGDOptimizer::state_dict) keeps only this rank's own part
  /// (error-feedback residuals, counters) and leaves out what is the same on
  /// every rank (anchors, outer state, an average in flight); save_sharded(dir)
  /// writes this rank's share of that, the parameters i with
  /// i % group size == group rank, to dir/shard_file_name(rank, size).
  /// load_sharded(dir) reads every shard of the set (any group size: each
  /// shard holds whole entries) and restores the anchors, outer state and an
  /// average in flight; call it after PostLocalSGDOptimizer::load_state_dict.
  /// Local (no communication); all ranks must see dir.
  void set_sharded_checkpoints(bool on) noexcept { sharded_ = on; }
  void save_sharded(const std::string& dir) const;
  void load_sharded(const std::string& dir);
  static std::string shard_file_name(int rank, int world_size);

  const DiLoCoOptions& options() const noexcept { return options_; }
  const std::vector<Tensor>& params() const noexcept { return params_; }
  const std::vector<Tensor>& anchors() const noexcept { return anchors_; }
  /// Fragment k's parameter indices (normalised: never empty).
  const std::vector<std::vector<std::int64_t>>& fragments() const noexcept { return fragments_; }
  /// Fragment k's outer optimizer (its parameters: the anchors of the fragment, in fragment order).
  Optimizer& outer_optimizer(std::size_t k) { return *outer_.at(k); }
  const Optimizer& outer_optimizer(std::size_t k) const { return *outer_.at(k); }
  /// The fragment whose average is in flight, if any.
  std::optional<std::size_t> pending_fragment() const noexcept;
  DiLoCoStats stats() const;

 private:
  struct Pending;
  void prepare(std::size_t k);
  /// Both forms of average_parameters: the schedule, prepare and sync.
  Future<void> call(bool background);
  /// Fragment k's completion (the wait, the outer step, the parameter
  /// update): here, or with `background` on the thread that completes its
  /// average (the future then kept in in_sync_ until settle()).
  Future<void> sync(std::size_t k, bool background);
  /// sync's completion, the same code on either thread (waits for `average`).
  void complete_sync(std::size_t k, const Future<void>& average, std::chrono::steady_clock::time_point t0);
  /// Rank thread, first in every call: waits for a sync in flight, joins the worker it ran on.
  void settle() const;
  void finish_pending();  // waits; the averaged deltas are then in pending_->deltas
  /// The average of p arrived (`average` ready): its error kept, or the
  /// deltas made averages; once (p.done).
  void land(Pending& p, const Future<void>& average);
  // replicated: anchors, outer state, average in flight (only the parameters
  // i % shards == shard); local: residuals.
  void save_into(StateDict& sd, bool replicated, bool local, int shard, int shards) const;
  void load_from(StateDict& sd, bool replicated, bool local);

  DiLoCoOptions options_;
  std::vector<Tensor> params_;
  std::vector<Tensor> anchors_;
  std::vector<std::vector<std::int64_t>> fragments_;
  std::vector<std::unique_ptr<Optimizer>> outer_;
  std::vector<Tensor> residuals_;  // error feedback, one float32 flat tensor per fragment (lazy)
  std::vector<std::vector<Tensor>> delta_bufs_;  // per fragment, reused by every sync (lazy)
  std::vector<Tensor> flat_bufs_;                // quantized formats: per fragment (lazy)
  std::unique_ptr<Pending> pending_;
  mutable Future<void> in_sync_;     // a sync completing in the background
  mutable std::thread done_worker_;  // the quantized worker that ran it, joined by settle()
  DiLoCoStats stats_;
  bool sharded_ = false;
};

}  // namespace dopt::optim
