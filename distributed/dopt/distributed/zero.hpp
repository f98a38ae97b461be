#pragma once
// dopt::optim::ZeroRedundancyOptimizer: ZeRO stage 1, torch 1.13's
// torch.distributed.optim.ZeroRedundancyOptimizer: each rank's local
// optimizer holds only the parameters it owns; after each step every
// parameter is broadcast from its owner. docs/zero.md explains the partition,
// the bucket views, the state dict layouts and the sharded checkpoint format.
//
//   auto zero = ZeroRedundancyOptimizer(params, OptimizerSpec{"Adam", {{"lr", 1e-3}}},
//                                       ZeroOptions{ctx.world()});
//   ... set grads (averaged over the ranks) ...
//   zero.step();          // local step on this rank's shard, then broadcasts
//
// Collective contract. These calls are collectives over the process group:
// every rank calls them, in the same order, with the same arguments where
// noted; nothing returns before the collective's data is in place:
//   constructor (an all_gather of a descriptor of the parameter list, which
//     must match on every rank: same groups, sizes, shapes, dtypes),
//   step(), step_async() (its data is in place once its future is ready),
//   add_param_group() (same group on every rank), consolidate_state_dict(),
//   save_sharded() (ends with a barrier), recover().
// Local (no communication): state_dict() (on the rank consolidate_state_dict
// gathered to; StateError elsewhere), load_state_dict(), load_sharded(),
// zero_grad(), param_groups(), join_hook(), the accessors.
// Not thread-safe: one thread per rank at a time. step() calls
// Join::notify_join_context(*this) first.
//
// step_async() (docs/zero.md, "step_async"): the local step on the calling
// thread, the broadcasts of the updated shards in the background; the
// Future completes (on a runtime thread) when every shard is in place and
// carries their error (a lost peer: PeerLostError) if one failed. A
// collective like step(), called where step() would be; bitwise step()'s
// parameters and state (the same code posts the same broadcasts). Until the
// future is ready the parameters this rank does not own are not final:
// reading them gets old or new values, writing them (a forward pass, the
// user's own updates) races the broadcasts. These calls wait for the step in
// flight first (a documented wait): step(), step_async(), add_param_group(),
// consolidate_state_dict(), state_dict(), load_state_dict(), save_sharded(),
// shard_state_dict(), load_sharded(), recover() and the destructor (which
// drops the error). When the background part failed, each of them (except
// the destructor) throws StateError naming itself and the failed step's
// error, from then on: the ranks' parameters may differ. zero_grad(),
// clip_grad_norm, the GradScaler's unscale_ and LR schedulers touch
// gradients and hyperparameters only, so they do not wait. step_async()
// completes before it returns (a ready future) with redundancy > 0 (its
// recovery is part of the step) and with overlap_with_ddp (step() only
// waits for the overlapped iteration there); then its errors are thrown as
// step()'s. It takes no closure: a closure's loss would need a forward pass
// over parameters still in flight.
//
// Parameters re-pointed at memory ZeRO owns (parameters_as_bucket_view,
// overlap_with_ddp): a parameter that is a view of memory dopt does not own
// (from_blob, from_dlpack) or shares its memory with another tensor object is
// a ValueError at construction and in add_param_group, unless
// ZeroOptions::rebind_parameter is set; that hook runs on the thread that
// re-pointed (the constructor's, add_param_group's, step()'s, or the rank
// thread running the overlap plan) and its exceptions propagate from there.
//
// Redundancy (ZeroOptions::redundancy = k > 0; docs/fault-tolerance-optimizers.md): the
// gradients must be the same on every rank at step(); a closure is a
// ValueError; overlap_with_ddp and add_param_group are NotSupportedError.
// When a member is lost inside step(), every survivor recovers in step(),
// completes the step, then calls ZeroOptions::on_membership_change or throws
// MembershipChangedError; a loss seen elsewhere (a PeerLostError from the
// trainer's own collective) is answered by recover() on every survivor.
// When a rank and all its buddies are lost: ShardLostError.
// ZeroBuddyUpdate::host_memory: the owner's bucket and state live in a
// shared-memory segment its buddies (ranks of its host) map; step() runs its
// CPU updates one parameter at a time on the calling thread, journaled; when
// every rank of the group is on one host and not all are threads of one
// process, step() has each rank copy the other ranks' new parameters out of
// their segments between two barriers of the group instead of broadcasting
// them (every rank takes this path alike, from the host map); the
// constructor, a change of trainable parameters and every recovery make and
// exchange segments (collective). A rank lost while its segment is being
// filled (construction, loads, the end of a recovery), or recover() outside
// step() after the lost rank began its next step: StateError.
//
// overlap_with_ddp (zero_overlap.hpp has the whole contract): needs an
// optimizer with a functional form (ValueError otherwise, before any
// collective). Until hook_with_zero_step[_interleaved] made the plan, and
// while an overlapped iteration is in flight, the state dict and checkpoint
// calls are StateError; step() waits for the iteration in flight (StateError
// before Reducer::finalize()), rethrows its error and returns nullopt;
// add_param_group is NotSupportedError.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/join.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/optim/clip_grad.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/distributed/recovery.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/state_dict.hpp"

namespace dopt::optim {

/// What the partition balances across ranks (see "Partition" above).
enum class ZeroPartitionWeight {
  /// Elements (torch's partition): balances optimizer state memory.
  element_count,
  /// OptimizerOptions::step_cost of each parameter under its group's
  /// options: balances the work of step(). For Muon this is the
  /// Newton-Schulz cost, ns_steps * (2 m^2 n + m^3) for an [m, n] matrix
  /// (m <= n); for the elementwise optimizers it is the element count.
  step_cost,
};

/// Redundancy: how a buddy keeps its copy of another rank's shard current
/// (docs/fault-tolerance-optimizers.md, "How the buddies keep up").
enum class ZeroBuddyUpdate {
  /// Every step() the buddy steps its copy with the same optimizer, the same
  /// hyperparameters and the averaged gradients: k extra optimizer steps over
  /// 1/N of the parameters per step; recovery needs nothing more.
  step,
  /// The buddy keeps a copy of the shard's averaged gradients (and the
  /// hyperparameters) of every step since the last snapshot, made while the
  /// parameter broadcasts are in flight; every ZeroOptions::snapshot_interval
  /// steps the owner sends its state to its buddies instead, which drop the
  /// saved steps. At recovery the buddy replays the saved steps with the
  /// same kernels in the same order: bitwise the state `step` would hold.
  /// Costs a gradient copy per step (none in a snapshot's step), the state
  /// sent and the shard's parameters copied once per interval, more memory
  /// (the state twice: the next snapshot lands in the buffers the last one
  /// replaced; the parameters; interval - 1 gradients), and up to
  /// snapshot_interval optimizer steps over the lost shard in the recovery.
  replay,
  /// The owner's shard (its parameter bucket and its optimizer state) lives
  /// in shared memory that its buddies on the same host keep mapped, so it
  /// outlives the owner's process; the owner journals its updates chunk by
  /// chunk, so a buddy rebuilds the shard exactly at whatever point the owner
  /// died. No copy and no extra step per step. Protects against the loss of
  /// processes, not of a host: every other rank of the owner's host maps the
  /// segment and is its buddy, whatever k (ValueError at construction for a
  /// rank alone on its host). Needs parameters_as_bucket_view, CPU parameters
  /// and an elementwise optimizer (not Muon). Where /dev/shm gives the
  /// segments 4 KiB pages (mounted without huge=advise or huge=always), the
  /// lowest rank of each host raises a dopt::notice when they are made.
  host_memory,
};

struct ZeroOptions {
  /// The ranks that share the optimizer state (required).
  ProcessGroup process_group;
  bool parameters_as_bucket_view = false;
  /// Step bucket by bucket from the reducer's comm hook (zero_overlap.hpp).
  bool overlap_with_ddp = false;
  /// overlap_with_ddp: the group ZeRO's broadcasts run on, over the same
  /// ranks as process_group and used by nothing else. Left invalid, the
  /// constructor makes one with process_group.new_group(ranks), which needs
  /// process_group to be the world group (ValueError otherwise).
  ProcessGroup overlap_broadcast_group = {};
  /// Called after ZeRO re-pointed `param` at memory it owns (bucket view,
  /// overlap buffers, a frozen parameter's own copy); it re-points the
  /// caller's tensor over the parameter's old memory at param's new memory
  /// (see "Caller-owned memory" above). Empty: parameters over memory dopt
  /// does not own, or shared with another tensor, are refused with those
  /// options.
  std::function<void(const Tensor& param)> rebind_parameter = {};
  /// (Last, so that positional initialisation of the fields above keeps
  /// working.) The weight of a parameter in the partition; every rank must pass the
  /// same (the constructor's cross-rank check covers it). Not used with
  /// overlap_with_ddp (the reducer's buckets are assigned whole).
  ZeroPartitionWeight partition_weight = ZeroPartitionWeight::element_count;
  /// Redundancy: each rank's optimizer state is also kept (and stepped) by
  /// this many buddies, so that training survives the loss of a rank (see
  /// "Redundancy and recovery" above). 0: off (torch's behaviour).
  int redundancy = 0;
  /// Redundancy: called on every survivor when step() recovered from a lost
  /// rank (then step() returns normally). Empty: step() throws
  /// MembershipChangedError instead.
  std::function<void(const ZeroRecovery&)> on_membership_change = {};
  /// Testing aid: called on this rank's thread at points of step():
  /// ("begin", step, 0) before the local step, ("computed", step, 0) after it
  /// (and the buddies' copies), ("broadcast", step, i) after posting the
  /// i-th broadcast, ("snapshot", step, 0) after the broadcasts of a step
  /// that ends with a snapshot (ZeroBuddyUpdate::replay); with
  /// ZeroBuddyUpdate::host_memory also ("chunk", step, c) after chunk c of a
  /// parameter's update is written and before it is committed, and
  /// ("committing", step, 0) between a parameter's state and its step count
  /// reaching shared memory. Fault-injection tests lose their rank there.
  std::function<void(const char* point, std::int64_t step, int index)> probe = {};
  /// Redundancy: the host of each group rank (equal strings: one host), the
  /// same list on every rank. Buddies are chosen on other hosts where there
  /// are any (see buddies()). Empty: measured, this_host_id() of every rank
  /// (dopt/actors/host.hpp), gathered at construction. Set it to override
  /// the measurement, or to play a multi-host layout in a test.
  std::vector<std::string> hosts = {};
  /// Redundancy: how the buddies keep their copies current.
  ZeroBuddyUpdate buddy_update = ZeroBuddyUpdate::step;
  /// Redundancy with ZeroBuddyUpdate::replay: the owner's state goes to its
  /// buddies at the end of every snapshot_interval-th step (>= 1), so a buddy
  /// saves at most this many steps' gradients.
  int snapshot_interval = 4;
  /// Redundancy with ZeroBuddyUpdate::host_memory: elements per journaled
  /// chunk of a parameter's update, in [1, 2^26], the same on every rank.
  std::int64_t host_memory_chunk = 65536;
};

/// The implementation (not installed): ZeroRedundancyOptimizer is its facade.
struct ZeroCore;
struct ZeroCoreAccess;

/// metadata["dopt.zero.format"] of a shard written by save_sharded.
inline constexpr const char* kZeroShardFormat = "dopt-zero-shard/1";

/// What load_sharded read.
struct ShardLoadReport {
  /// World size the checkpoint was saved at.
  int saved_world_size = 0;
  /// Ranks whose shard files this rank opened, in the order it opened them.
  std::vector<int> shards_read;
  /// State tensors read.
  std::int64_t tensors_read = 0;
};

class ZeroRedundancyOptimizer : public Joinable {
 public:
  /// One group of params. Throws (on the calling rank, before any collective)
  /// ValueError for an empty list, an invalid process group, parameters on
  /// different device types or in two groups; TypeError for undefined or
  /// non-floating-point parameters or group options of another optimizer's
  /// type; ValueError for overlap_with_ddp with an optimizer without a
  /// functional form. The descriptor check throws
  /// ValueError on every rank when the ranks' parameter lists differ.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerSpec spec, ZeroOptions options);
  /// Several groups; a group without options takes the spec's hyperparameters.
  ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> groups, OptimizerSpec spec, ZeroOptions options);
  /// Typed options instead of a spec: ZeroRedundancyOptimizer(params,
  /// AdamOptions(1e-3), zo) is ZeroRedundancyOptimizer(params, spec_of(AdamOptions(1e-3)), zo).
  ZeroRedundancyOptimizer(std::vector<Tensor> params, const OptimizerOptions& optimizer, ZeroOptions options);
  ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> groups, const OptimizerOptions& optimizer,
                          ZeroOptions options);
  ~ZeroRedundancyOptimizer() override;
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  /// Collective. See the header. Returns the closure's loss (as computed on
  /// this rank), or nullopt without a closure.
  std::optional<double> step(const Optimizer::LossClosure& closure = nullptr);
  /// Collective, where step() would be (see the header): the local step
  /// here, the broadcasts in the background; the future is ready once every
  /// shard is in place and carries the first broadcast's error. Errors of
  /// the local step (before anything is posted) are thrown here.
  /// step_count() counts it when it returns.
  Future<void> step_async();
  /// Clears the gradients of *all* parameters (torch: inherited zero_grad).
  void zero_grad(bool set_to_none = false);
  /// Collective: every rank adds the same group; the partition is recomputed
  /// (earlier groups keep their owners), the local optimizer gets this rank's
  /// part of the new group (possibly empty), buckets are rebuilt.
  void add_param_group(OptimizerParamGroup group);

  /// Collective: gathers all local state dicts on group rank `to`; wipes any
  /// earlier consolidation on every rank.
  void consolidate_state_dict(int to = 0);
  /// The global state dict (unsharded layout, CPU tensors); only on the rank
  /// of the last consolidate_state_dict, StateError elsewhere.
  StateDict state_dict() const;
  /// Loads a global state dict (from state_dict() or an unsharded optimizer
  /// over the same groups) on this rank: group count and sizes must match
  /// (StateDictError), indices must be in range (StateDictError); state of
  /// owned parameters is copied (cast to the parameter's dtype except `step`,
  /// 0-d tensors on the CPU) and replaces the local state; hyperparameters
  /// come from the dict. Nothing changes when it throws.
  void load_state_dict(const StateDict& sd);
  /// load_state_dict(dopt::load_state_dict(path)) without reading the whole
  /// file: only the state of the parameters this rank keeps is read, each
  /// tensor once (the same checks and errors; IOError for an unreadable file).
  void load_state_dict(const std::string& path);

  /// Collective: writes this rank's shard to dir/optim-rank{r}-of-{N}.safetensors
  /// (dir is created), then waits for every rank (barrier). `metadata` is
  /// added to the shard's (a checkpoint's identity, ...); ValueError for a
  /// key that starts with "dopt.zero.".
  void save_sharded(const std::string& dir, const std::map<std::string, std::string>& metadata = {}) const;
  /// Local (no communication; rank thread, between steps): this rank's shard
  /// as save_sharded writes it, `metadata` added, its state tensors copied to
  /// the CPU. The copy is a snapshot: training may go on while another thread
  /// writes it with save_state_dict(shard, dir + "/" + shard_file_name(rank(),
  /// world_size())), and load_sharded reads such files as save_sharded's.
  /// ValueError for a metadata key that starts with "dopt.zero."; StateError
  /// mid-iteration with overlap_with_ddp.
  StateDict shard_state_dict(const std::map<std::string, std::string>& metadata = {}) const;
  /// Loads a checkpoint written by save_sharded at any world size. Throws
  /// IOError for missing/unreadable shards or several world sizes in dir, and
  /// StateDictError when the checkpoint's parameters or groups do not match,
  /// or when a shard it reads was saved at another step than rank 0's (a
  /// folder that mixes shards of two checkpoints: the message names the odd
  /// file and both steps).
  ShardLoadReport load_sharded(const std::string& dir);
  /// Redundancy: collective of the survivors after a PeerLostError outside
  /// step() (see the header). Throws ShardLostError when state is gone.
  ZeroRecovery recover();
  /// Redundancy in effect (ZeroOptions::redundancy capped at size() - 1).
  int redundancy() const noexcept;
  /// The group ranks that keep rank r's shard (its buddies), in order. On
  /// one host: r+1, ..., r+k (cyclically). Over several hosts: ranks on
  /// other hosts first, each rank keeping as few shards as that allows (the
  /// rule is in docs/fault-tolerance-optimizers.md), so that losing a host loses no
  /// state when every host's ranks have buddies elsewhere. With
  /// ZeroBuddyUpdate::host_memory: every other rank of r's host.
  std::vector<int> buddies(int r) const;
  /// Bytes of the copies of other ranks' state this rank keeps (with
  /// ZeroBuddyUpdate::replay also the saved parameters and gradients and the
  /// next snapshot's buffers).
  std::int64_t buddy_state_bytes() const;
  ZeroBuddyUpdate buddy_update() const noexcept;
  /// ZeroBuddyUpdate::host_memory: whether step() copies the other ranks'
  /// new parameters out of their segments instead of broadcasting them
  /// (every rank of the group on one host, not all threads of one process;
  /// the same on every rank). Changes with a recovery.
  bool reads_parameters_from_segments() const noexcept;

  /// The shard file name of rank r of n.
  static std::string shard_file_name(int rank, int world_size);

  // --- Joinable ------------------------------------------------------------------
  /// main_hook: step() (with whatever gradients this rank holds); post_hook: nothing.
  std::unique_ptr<JoinHook> join_hook() override;
  /// The device of the first parameter.
  Device join_device() const override;
  ProcessGroup join_process_group() const override;

  // --- accessors -----------------------------------------------------------------
  /// Global groups (all parameters, hyperparameters synchronised with the local optimizer).
  std::vector<OptimizerParamGroup>& param_groups() noexcept;
  const std::vector<OptimizerParamGroup>& param_groups() const noexcept;
  /// The local optimizer over this rank's shard.
  Optimizer& optim() noexcept;
  const Optimizer& optim() const noexcept;
  const OptimizerSpec& spec() const noexcept;
  const ProcessGroup& process_group() const noexcept;
  int rank() const noexcept;
  int world_size() const noexcept;
  bool parameters_as_bucket_view() const noexcept;
  ZeroPartitionWeight partition_weight() const noexcept;
  /// The weight of every parameter in the partition, by global index.
  std::vector<double> partition_weights() const;
  /// partition()[r][g]: rank r's parameters of group g, in assignment order.
  const std::vector<std::vector<std::vector<Tensor>>>& partition() const noexcept;
  /// Owner rank of each parameter, by global index (position in the chain of groups).
  std::vector<int> param_owners() const;
  /// Global index of p (-1 when p is not one of the parameters).
  std::int64_t global_index(const Tensor& p) const;
  /// Every parameter, by global index.
  const std::vector<Tensor>& all_params() const noexcept;
  /// Number of buckets per rank (0 without bucket view).
  std::size_t bucket_count() const noexcept;
  /// buckets()[k][r]: the flat buffer of kind k (device, dtype) of rank r.
  /// After a recovery from a lost rank (redundancy) a kind can have more
  /// than one row: the survivors' buckets stay, and the parameters that came
  /// from lost ranks are in a row of their own (bucket_count() grows).
  const std::vector<std::vector<Tensor>>& buckets() const noexcept;
  /// Bytes of the local optimizer's state on this rank (with overlap: call it
  /// between iterations; mid-iteration the state is with the worker).
  std::int64_t local_state_bytes() const;
  /// step() and step_async() calls made so far (a step_async in flight
  /// counted; restored by load_sharded); with overlap: the overlapped
  /// iterations completed.
  std::int64_t step_count() const noexcept;
  bool overlap_with_ddp() const noexcept;
  /// overlap_with_ddp: the owner rank of each reducer bucket, by bucket index
  /// (empty before the plan).
  std::vector<int> overlap_bucket_owners() const;

 private:
  // Everything else is the implementation's (distributed/src/zero/zero_core.hpp):
  // the pieces of docs/architecture.md, "ZeRO inside".
  std::unique_ptr<ZeroCore> core_;
  /// Hands core_ to the hook factories of zero_overlap.hpp (zero_core.hpp); nothing else.
  friend struct ZeroCoreAccess;
};

// --- stage 2: sharded gradients, with the Reducer ------------------------------
/// `options` with ReducerOptions::gradient_owners set to zero's owner of each
/// of `params` (the list the Reducer registers, in its order). A Reducer over
/// zero.process_group() built with them keeps on each rank only the averaged
/// gradients of the parameters it owns (reducer.hpp, "ZeRO stage 2");
/// zero.step() is unchanged (docs/zero-stage2-3.md, "Stage 2"). Local: no
/// communication, any thread that may read zero. Throws ValueError for a
/// parameter zero does not hold; NotSupportedError when zero has redundancy
/// (its buddies step other ranks' shards from their averaged gradients, which
/// stage 2 does not keep), overlap_with_ddp (it steps from the comm hook), or
/// options.survive; each message names zero_stage2_options and the rank.
ReducerOptions zero_stage2_options(const ZeroRedundancyOptimizer& zero, const std::vector<Tensor>& params,
                                   ReducerOptions options = {});

// --- growing back: a newcomer catches up -------------------------------------
/// After ProcessGroup::grow() / join_group() (process_group.hpp; design in
/// docs/growing-back.md): brings `zero`, a
/// ZeroRedundancyOptimizer over grown.group, to where the members' optimizer
/// over the old group stands. Collective over grown.group: every member and
/// every newcomer calls it, on its rank thread, at a step boundary, after
/// constructing `zero` with the same parameter list (groups, shapes, dtypes),
/// spec and options as the members' optimizer and process_group =
/// grown.group (a newcomer's parameter values and numeric hyperparameters
/// do not matter: they are sent). `before`: on a member its optimizer over the old
/// group (its state is moved out: destroy it afterwards, never step it
/// again); null on a newcomer. Moves, point to point over grown.group: each
/// parameter's optimizer state from its owner in `before` to the ranks that
/// keep it in `zero` (its owner and, with redundancy, its buddies: the
/// copies are rebuilt); the parameters, hyperparameters and step_count() to
/// each newcomer from the lowest-ranked member. Then `zero` steps bitwise as
/// `before` would have, over the larger group. With parameters_as_bucket_view
/// a member's parameters are views of before's buckets when it constructs
/// `zero`: set ZeroOptions::rebind_parameter there (a hook that does nothing
/// where the caller holds the parameter tensors themselves). Throws
/// ValueError (naming zero_catch_up and the rank) when `before` is null on a member or set on a
/// newcomer, when zero is not over grown.group, or when before's parameters
/// are not zero's; NotSupportedError with overlap_with_ddp and with
/// redundancy under buddy_update replay or host_memory; PeerLostError
/// when a rank is lost meanwhile (zero and before are then unusable: fall
/// back to the last checkpoint). On a member, once caught up, zero's
/// ZeroOptions::on_membership_change (when set) is called with the join
/// (ZeroRecovery::joined, step = step_count(), step_completed false); without
/// one nothing is thrown (the caller grew the group).
void zero_catch_up(ZeroRedundancyOptimizer& zero, ZeroRedundancyOptimizer* before, const GrowResult& grown);

// --- with the single-rank training utilities of dopt/optim/ ------------------
class GradScaler;
class ParamGroupAccess;

/// clip_grad_norm (clip_grad.hpp), sharded for ZeRO. Collective over
/// zero.process_group(): every rank calls it, in the same order with respect to the other collectives,
/// with the same max_norm and options. Each rank computes the norms of the
/// gradients of the parameters it owns; one all-reduce of one number and one
/// flag per parameter gives every rank all of them; each rank then computes
/// the total exactly as torch does over the full gradients (same order: the
/// parameters by global index, those whose owner has no gradient left out)
/// and scales the gradients it owns. Gradients of parameters owned by other
/// ranks are not read and not changed (the step never reads them). Returns
/// the same total on every rank, bit for bit torch's clip_grad_norm_ over the
/// full gradients; with error_if_nonfinite every rank throws together.
/// Not with overlap_with_ddp (StateError: the gradients are consumed bucket
/// by bucket during backward).
double clip_grad_norm(ZeroRedundancyOptimizer& zero, double max_norm, const ClipGradNormOptions& options = {});
/// GradScaler (grad_scaler.hpp): scaler.unscale_(zero) unscales the gradients
/// this rank owns (the only ones its step reads) and agrees on inf/NaN over
/// zero.process_group(); scaler.step(zero) steps or skips on every rank
/// together. Not with overlap_with_ddp (NotSupportedError).
void grad_scaler_unscale(GradScaler& scaler, ZeroRedundancyOptimizer& zero);
bool grad_scaler_step(GradScaler& scaler, ZeroRedundancyOptimizer& zero);
/// LR schedulers (lr_scheduler.hpp) drive ZeRO's global param groups; every
/// rank builds and steps the same scheduler.
std::shared_ptr<ParamGroupAccess> schedule_access(ZeroRedundancyOptimizer& zero);

}  // namespace dopt::optim
