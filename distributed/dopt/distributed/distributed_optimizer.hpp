#pragma once
// DistributedOptimizer over dopt::rpc (torch.distributed.optim.DistributedOptimizer,
// docs/rpc.md).
//
//   // trainer (any worker):
//   std::vector<rpc::RRef<Tensor>> params = ...;   // owned by parameter-server workers
//   DistributedOptimizer opt(agent, OptimizerSpec{"Adam", {{"lr", 1e-3}}}, params);
//   rpc::GradContext ctx = agent.new_context();
//   ctx.deposit_all({{params[0], g0}, {params[1], g1}});   // backward's result
//   opt.step(ctx);                                          // one message per owner, all at once
//
// Contract
//   * Construction groups the parameters by owner and makes, on every owner
//     (one remote() per owner, the spec travelling as JSON), a local
//     functional optimizer (make_functional, so every registered class works)
//     over the owner's tensors themselves. It waits until every owner has
//     built it: a bad spec or a parameter that is not a float tensor fails
//     here (the owners' errors, type kept).
//   * step(ctx) waits for the context's deposits, then sends one message per
//     owner, all at once; each owner takes the context's gradients of its
//     parameters (context_grad) and runs its local optimizer's step. It
//     completes when every owner has applied its update, or fails with the
//     errors of every owner that failed, named (worker and rank), with the
//     type of the first failure (PeerLostError for a dead owner, at once;
//     TimeoutError after `timeout`).
//   * A parameter without a gradient in the context is skipped (no update,
//     no state), in that step only: no gradient is ever reused from an
//     earlier step or context (torch's Python path reapplies a stale .grad).
//   * Owners serialise steps: every worker runs at most one local-optimizer
//     step at a time (of any DistributedOptimizer, from any trainer), so
//     concurrent trainers on shared owners lose no update; the order of two
//     trainers' steps is the order their messages arrive.
//   * The result equals, bit for bit, the local optimizer class applying the
//     same gradients (functional.hpp's contract).
//   * Beyond torch: zero_grad(ctx) drops the context's gradients of these
//     parameters on every owner; set_lr / set_hyperparameters change the
//     local optimizers on every owner (all at once, returns when all have);
//     every learning-rate scheduler of lr_scheduler.hpp drives them (one
//     round of messages per scheduler step); DistributedLambdaLR below is
//     the older LambdaLR-only form.
//   * The object is used by one thread at a time; its calls may overlap with
//     other trainers' calls on the same owners.
//
// Redundancy (DistributedOptimizerOptions::redundancy = k > 0;
// docs/fault-tolerance-optimizers.md, "DistributedOptimizer")
//   * Each owner's parameters and optimizer state are mirrored on its k
//     buddies (the next owners of owners(), cyclically; k + 1 owners or more,
//     ValueError otherwise). The constructor copies the parameters' values to
//     the buddies; in every step the owner forwards the gradients it read to
//     its buddies, which step their copies with the same optimizer (bitwise
//     the owner's), and replies once they did. Hyperparameter changes reach
//     the copies too. A parameter must belong to one redundant
//     DistributedOptimizer only (a copy sees only this optimizer's steps).
//   * Steps are numbered: an owner applies step s only once (a step resent
//     after a recovery is skipped where it was applied).
//   * When an owner is lost (PeerLostError from a deposit or a step), step()
//     recovers on the calling thread: the trainer and the surviving owners
//     agree on the membership (rpc::agree_membership, rpc_membership.hpp: a
//     new epoch; owners refuse messages of an older one), each lost owner's
//     parameters are taken over by its surviving buddy that stepped furthest
//     (parameters() returns the new RRefs; the trainer's old ones point at
//     the lost worker), and the step in flight is redone: owners that applied
//     it skip it; a taken-over parameter whose buddy had applied it is done;
//     the others' gradients went with the lost owner, so the trainer deposits
//     them again (OwnerRecovery::needs_gradient, on parameters()) into the
//     same context. Then on_membership_change(recovery) is called (deposit
//     the missing gradients there: step() then redoes the step and returns
//     normally), or step() throws OwnersChangedError (a MembershipChangedError):
//     recovery().step_completed says whether the step was completed; when it
//     was not, deposit owner_recovery().needs_gradient again and call step(ctx)
//     again.
//   * A loss seen elsewhere (to_here, a deposit outside step) is answered by
//     recover(). zero_grad / set_lr / set_hyperparameters / commit recover
//     and complete themselves, then report like step().
//   * An owner lost with all its buddies: OwnerStateLostError naming the
//     parameters and the owners; fall back to the last checkpoint.
//   * step_async completes before it returns when redundancy > 0.
//   * Taken-over parameters have the remaining buddies of their lost owner
//     only: redundancy is not restored after a loss, until a newcomer takes
//     them (distributed_optimizer_catch_up below).
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/recovery.hpp"

namespace dopt::optim {

/// What a recovery from lost owners did (redundancy > 0).
struct OwnerRecovery {
  /// The owners lost (by this recovery), by rank.
  std::vector<rpc::WorkerInfo> lost;
  /// The membership epoch agreed (rpc_membership.hpp).
  std::uint64_t epoch = 0;
  /// Indices into parameters() whose owner changed.
  std::vector<std::size_t> moved;
  /// Indices into parameters() whose gradients for the step in flight went
  /// with their owner: deposit them again, on parameters(), into `context`.
  std::vector<std::size_t> needs_gradient;
  /// The context of the step in flight (0: none, recover()).
  std::uint64_t context = 0;
  /// step_count() after the recovery.
  std::int64_t step = 0;
  /// Whether the step in flight was completed (false after recover()).
  bool step_completed = false;
  /// A join (distributed_optimizer_catch_up): the newcomers that became
  /// owners, by rank; `moved` then also holds the parameters they took.
  /// Empty after a loss.
  std::vector<rpc::WorkerInfo> joined = {};
};

/// Thrown by a redundant DistributedOptimizer on the trainer after it
/// recovered from lost owners (no on_membership_change callback). Caught as
/// MembershipChangedError, recovery() carries lost (ranks), step and
/// step_completed (its group is invalid: RPC workers have none).
class OwnersChangedError : public MembershipChangedError {
 public:
  OwnersChangedError(std::string op, std::string what, OwnerRecovery r, std::optional<int> rank);
  const OwnerRecovery& owner_recovery() const noexcept { return owner_recovery_; }

 private:
  OwnerRecovery owner_recovery_;
};

/// An owner and all its buddies were lost: the message names the parameters
/// (indices) and owners whose state is gone. The optimizer is unusable.
class OwnerStateLostError : public StateError {
 public:
  using StateError::StateError;
};

struct DistributedOptimizerOptions {
  /// Deadline of each message to the owners; empty: the agent's rpc_timeout.
  std::optional<std::chrono::milliseconds> timeout;
  /// Resends of each message after its deadline (same call id: an owner
  /// applies a step at most once, rpc.hpp's idempotency).
  int retries = 0;
  /// Each owner's parameters and state mirrored on this many buddy owners
  /// (see "Redundancy" above). 0: off (torch's behaviour).
  int redundancy = 0;
  /// Redundancy: called on the trainer after a recovery (see above). Empty:
  /// OwnersChangedError is thrown instead.
  std::function<void(const OwnerRecovery&)> on_membership_change = {};
};

struct OwnerMirror;

/// The value each owner keeps (local functional optimizer + its parameters).
struct OwnerOptimizer {
  std::unique_ptr<FunctionalOptimizer> optimizer;
  std::vector<rpc::RRef<Tensor>> params;
  std::vector<std::uint64_t> ids;
  long steps = 0;
  /// Redundancy: the membership line and the copies on the buddies.
  std::uint64_t line = 0;
  std::vector<rpc::RRef<OwnerMirror>> mirrors;
};

/// A buddy's copy of an owner's parameters (this worker's own tensors) and
/// optimizer state, stepped with the owner's gradients.
struct OwnerMirror {
  std::unique_ptr<FunctionalOptimizer> optimizer;
  std::vector<rpc::RRef<Tensor>> params;
  std::uint64_t line = 0;
  int primary = -1;
  long steps = 0;
  bool promoted = false;
};

class DistributedOptimizer {
 public:
  DistributedOptimizer(rpc::Agent agent, OptimizerSpec spec, const std::vector<rpc::RRef<Tensor>>& params,
                       DistributedOptimizerOptions options = {});
  /// Typed options instead of a spec: DistributedOptimizer(agent,
  /// AdamOptions(1e-3), params) is DistributedOptimizer(agent, spec_of(AdamOptions(1e-3)), params).
  DistributedOptimizer(rpc::Agent agent, const OptimizerOptions& optimizer,
                       const std::vector<rpc::RRef<Tensor>>& params, DistributedOptimizerOptions options = {});

  /// One step on every owner with the gradients of ctx (see the header).
  void step(const rpc::GradContext& ctx);
  Future<void> step_async(const rpc::GradContext& ctx);
  /// The same for a context id (e.g. one made by another worker).
  Future<void> step_async(std::uint64_t context_id);

  /// Drops ctx's gradients of these parameters on every owner.
  void zero_grad(const rpc::GradContext& ctx);
  /// Sets the learning rate of every owner's local optimizer.
  void set_lr(double lr);
  /// Overwrites hyperparameters on every owner (validated there; invalid
  /// values change nothing on that owner and fail the call).
  void set_hyperparameters(const Hyperparams& h);
  /// Every owner's learning rate, in owners() order.
  std::vector<double> lrs() const;

  /// The hyperparameters this object last gave the owners (every key, the
  /// class's defaults filled in), plus staged ones; local, no message.
  const Hyperparams& hyperparameters() const noexcept { return hyper_; }
  /// Changes hyperparameters here only; commit_hyperparameters() sends every
  /// staged key to every owner in one round (how schedulers reach the
  /// owners: lr_scheduler.hpp). set_lr / set_hyperparameters stage and commit.
  void stage_hyperparameters(const Hyperparams& h);
  /// Sends the staged keys (nothing to do when none are staged). On failure
  /// they stay staged and the error is thrown.
  void commit_hyperparameters();
  /// torch's param_group['initial_lr'] of the one group (schedulers).
  std::optional<double>& initial_lr() noexcept { return initial_lr_; }

  /// The owners, by rank (after a takeover, a worker that took over a lost
  /// owner's parameters appears once more).
  std::vector<rpc::WorkerInfo> owners() const;
  /// The parameters, in the constructor's order; after a recovery the
  /// taken-over ones are RRefs to the buddies' copies.
  const std::vector<rpc::RRef<Tensor>>& parameters() const noexcept { return params_; }
  /// Steps completed.
  std::int64_t step_count() const noexcept { return steps_; }
  /// Redundancy: after a PeerLostError seen outside this object's calls
  /// (an owner lost), agrees on the membership and takes the lost owners'
  /// parameters over; no step is taken. Returns what it did (nothing lost
  /// yet: a recovery with `lost` empty). OwnerStateLostError as above.
  OwnerRecovery recover();
  const OptimizerSpec& spec() const noexcept { return spec_; }
  std::size_t num_params() const noexcept { return num_params_; }

  /// Registers the owner-side functions ("dopt.optim.*"). Idempotent; runs
  /// at static initialisation of any program that links this file, and from
  /// the constructor.
  static void register_functions();

 private:
  friend OwnerRecovery distributed_optimizer_catch_up(DistributedOptimizer& opt, const std::vector<rpc::To>& newcomers);
  struct Mirror {
    int rank = -1;
    rpc::RRef<OwnerMirror> ref;
  };
  struct Owner {
    int rank = -1;
    /// The worker whose slot this is: the constructor's owner, or the
    /// newcomer that took the slot (catch_up); rank differs after a takeover.
    int home = -1;
    rpc::RRef<OwnerOptimizer> local;
    std::vector<std::size_t> params;  // indices into params_
    std::vector<Mirror> mirrors;
  };
  /// Sends method(args...) to every owner at once; joins the results.
  template <class... A>
  Future<void> fan_out(const std::string& what, const std::string& method, const A&... args) const;
  /// The same, one result per owner (redundancy: the recovery reads them).
  template <class... A>
  std::vector<std::exception_ptr> fan_out_each(const std::string& method, const A&... args) const;
  void step_redundant(const rpc::GradContext& ctx);
  /// Agreement and takeover; `in_step`: the step in flight is steps_.
  /// `joining`: newcomers agreed on as members too (catch_up).
  OwnerRecovery recover_owners(bool in_step, std::uint64_t context, const std::vector<int>& joining = {});
  /// Runs `call` (a fan_out over the owners); on a lost owner recovers and
  /// runs it again; then `after`, then reports the recovery.
  void with_recovery(const char* op, const std::function<void()>& call, const std::function<void()>& after = {});
  void report(const char* op, OwnerRecovery r);

  rpc::Agent agent_;
  OptimizerSpec spec_;
  DistributedOptimizerOptions options_;
  std::vector<Owner> owners_;
  std::vector<rpc::RRef<Tensor>> params_;
  std::uint64_t line_ = 0;
  std::uint64_t epoch_ = 0;
  std::int64_t steps_ = 0;
  std::vector<int> lost_;  // owners lost so far
  std::size_t num_params_ = 0;
  Hyperparams hyper_;
  Hyperparams staged_;
  std::optional<double> initial_lr_;
};

// --- growing back: a newcomer becomes an owner --------------------------------
/// Redundancy (design in docs/growing-back.md, "DistributedOptimizer's catch-up"): makes
/// `newcomers` (live workers of the RPC world that are not yet owners or
/// buddies of `opt`, by name or rank; the world is fixed at rpc::init, so a
/// newcomer is a standby worker) owners again of the slots of lost owners.
/// A slot is the parameters one owner held at construction; a slot is vacant
/// while a buddy holds it after a takeover. Called by the trainer, on the
/// thread that uses `opt`, between steps (no step in flight); the owners and
/// newcomers take part through registered functions (nothing to call
/// there). In order:
///   1. the trainer, the owners, the buddies and the newcomers agree on the
///      membership (rpc::agree_membership, a new epoch with the newcomers);
///      owners lost meanwhile are taken over as in a recovery;
///   2. the vacant slots, in the constructor's order, go to the newcomers in
///      ascending rank: each slot's holder sends its parameters, optimizer
///      state (the functional optimizer's state dict: state tensors,
///      hyperparameters) and step number to its newcomer, point to point;
///   3. the buddies are rebuilt by the constructor's rule over the grown set
///      of owners: each slot's buddies are the next `redundancy` owners after
///      its owner (cyclically by rank; fewer when there are not as many other
///      owners). A copy already on such a buddy stays; the other buddies get
///      a copy from the slot's owner, point to point; copies elsewhere go.
/// parameters() then returns the newcomers' RRefs for the slots they took;
/// training goes on bitwise as it would have without the loss. Returns the
/// record (joined, moved: the parameters that moved, lost: owners lost
/// meanwhile, step = step_count(), step_completed false) and calls
/// DistributedOptimizerOptions::on_membership_change with it when set.
/// Throws NotSupportedError (naming distributed_optimizer_catch_up and the
/// trainer's rank) without redundancy and for more newcomers than vacant
/// slots; ValueError for a newcomer that is the trainer, an owner or buddy,
/// named twice or unknown; PeerLostError for a newcomer lost before it took its
/// slot, or any worker lost while the state moves (no slot went to a newcomer;
/// owners lost before the call were taken over by their buddies all the same,
/// which the error names; call again); an owner's refusal of its new buddies
/// (an error that is not a loss, of its kind) rolls the call back: the
/// newcomers are not members, every owner keeps the slots and buddies it had
/// before the call, the next step runs as without the call (call again);
/// OwnerStateLostError as recover(). A call that fails after owners were
/// taken over (lost before or during it) calls on_membership_change once
/// with those takeovers (joined empty, no gradient to deposit), then throws.
OwnerRecovery distributed_optimizer_catch_up(DistributedOptimizer& opt, const std::vector<rpc::To>& newcomers);

/// torch's LambdaLR over a DistributedOptimizer: lr = base_lr * lambda(epoch)
/// on every owner; the constructor sets epoch 0, step() advances.
class DistributedLambdaLR {
 public:
  DistributedLambdaLR(DistributedOptimizer& opt, std::function<double(int)> lambda);
  void step();
  int last_epoch() const noexcept { return epoch_; }
  double last_lr() const noexcept { return last_lr_; }

 private:
  DistributedOptimizer& opt_;
  std::function<double(int)> lambda_;
  double base_lr_;
  int epoch_ = 0;
  double last_lr_ = 0;
};

// --- with the single-rank training utilities of dopt/optim/ ------------------
class GradScaler;
class ParamGroupAccess;

/// GradScaler (grad_scaler.hpp), for a trainer (it decides alone: its
/// gradients are its own): scaler.unscale_(optimizer, grads) unscales its
/// gradient tensors before depositing them; scaler.step(optimizer, ctx)
/// needs that call in this iteration (StateError), and a skipped step drops
/// the context's gradients on the owners.
void grad_scaler_unscale(GradScaler& scaler, DistributedOptimizer& optimizer, const std::vector<Tensor>& grads);
bool grad_scaler_step(GradScaler& scaler, DistributedOptimizer& optimizer, const rpc::GradContext& ctx);
/// LR schedulers (lr_scheduler.hpp): one group; changes are staged and
/// committed to every owner in one round after each scheduler step.
std::shared_ptr<ParamGroupAccess> schedule_access(DistributedOptimizer& optimizer);

}  // namespace dopt::optim
