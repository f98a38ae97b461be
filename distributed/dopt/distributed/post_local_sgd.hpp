#pragma once
// dopt::optim::PostLocalSGDOptimizer: torch 1.13's
// torch.distributed.optim.PostLocalSGDOptimizer, plus one
// checked configuration from which both halves of post-local SGD are built:
// the gradient side (post_localSGD_hook with PostLocalSGDState, reducer.hpp)
// and the parameter side (PeriodicModelAverager).
//
//   PostLocalSGDConfig cfg{ctx.world()};
//   cfg.start_localSGD_iter = 100; cfg.period = 4;           // subgroup: one per node
//   auto state = cfg.make_hook_state();                      // for the reducer's hook
//   reducer.register_comm_hook(post_localSGD_hook(state));
//   PostLocalSGDOptimizer opt(std::make_unique<SGD>(params, SGDOptions(0.1)), cfg.make_averager(), *state);
//   for (...) { ...gradients...; reducer.finalize(); opt.step(); }
//
// Collective contract: step() is a collective over the averager's group on
// the steps it averages (every rank calls step() once per iteration, with
// the same parameters having gradients). Everything else is local. Not
// thread-safe: one thread per rank.
//
// Differences from torch (docs/post-local-sgd.md): step() takes no closure
// (as torch); the averager's step lives in StateDict::metadata["step"]
// (decimal) since dopt's StateDict has no free top-level keys; the schedule
// check below does not exist in torch.
//
// step_async() (dopt only; docs/post-local-sgd.md, "step_async"): the local
// step on the calling thread, the averager's collective in the background:
// PeriodicModelAverager's and HierarchicalModelAverager's average
// (average_parameters_async), DiLoCoAverager's sync (its
// average_parameters_async: the outer step runs where the average
// completes). Called where step() would be; bitwise step()'s parameters,
// state and averager counter (the same averaging code). The future is ready
// once the parameters hold their new values (at once on steps that do not
// average) and carries the collective's error. Until then the averaged
// parameters are not final: reading them races the average. These calls
// wait for it first (a documented wait): step(), step_async(), skip_step(),
// add_param_group(), recover(), state_dict(), load_state_dict(),
// enable_survive() and the destructor; zero_grad(), clip_grad_norm and the
// GradScaler's unscale_ touch gradients only and do not wait, nor do the
// accessors (optim(), averager(), state(), param_groups()), which must not
// be used to change parameters or state meanwhile. A failed average makes
// every later waiting call throw StateError naming itself and that error
// (the ranks' parameters may differ), except with DiLoCoAverager, whose
// failed fragment is back at its anchors as after a failed step() (the
// error stays with the future). It completes before it returns (a ready
// future; errors thrown as step()'s) after enable_survive() (the recovery
// is part of the step) and with any other averager (its
// average_parameters is all there is).
//
// Surviving a lost rank (dopt only; docs/fault-tolerance-optimizers.md), after
// enable_survive(): on the steps that average, the parameters to average are
// copied first. When the average fails with PeerLostError, every survivor
// shrinks the averager's group (ProcessGroup::shrink()), checks that the
// survivors stopped in the same step, puts the copied parameters back and
// averages them again over the survivors' group: the average of that step is
// the survivors' (divided by their count), whichever dtype's all-reduce had
// completed before the loss. Then step() calls on_membership_change(recovery)
// and returns, or throws MembershipChangedError (recovery.hpp) carrying it; the
// step was completed either way and the averager runs over recovery.group
// from now on. Local steps never communicate, so a rank lost between
// averaging steps is noticed at the next average (or by the trainer's own
// collectives: then recover(), below). Only PeriodicModelAverager can go on
// over a shrunk group (NotSupportedError from enable_survive otherwise).
//
// Growing back (dopt only; docs/growing-back.md): after
// the averager's group grew (ProcessGroup::grow(), join_group()), every rank
// of the grown group calls post_local_sgd_catch_up (below): the members go on
// with their optimizers over the grown group, a newcomer's fresh optimizer
// becomes a copy of the lowest-ranked member's.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/optim/clip_grad.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/distributed/recovery.hpp"

namespace dopt::optim {

/// The metadata key of the averager's step in PostLocalSGDOptimizer::state_dict().
inline constexpr const char* kAveragerStepKey = "step";

/// Throws ValueError when the hook state's start_localSGD_iter differs from
/// the averager's warmup_steps: the gradients would stop being averaged
/// globally at one step and the parameters start being averaged at another
/// (a silent gap, or double averaging). The message names both values.
void check_post_local_sgd_schedule(const PostLocalSGDState& state, const ModelAverager& averager);

/// One post-local SGD schedule: global data parallelism for
/// start_localSGD_iter steps, then local SGD on `subgroup` with the
/// parameters averaged on process_group every `period` steps.
struct PostLocalSGDConfig {
  /// The global group (the averager's and the warm-up all-reduce's).
  ProcessGroup process_group;
  /// Where gradients are averaged after warm-up; invalid: one per node
  /// (created lazily by the hook, see comm_hooks.hpp).
  ProcessGroup subgroup;
  /// = the averager's warmup_steps.
  std::int64_t start_localSGD_iter = 0;
  /// The averager's period.
  std::int64_t period = 1;
  bool post_local_gradient_allreduce = true;

  explicit PostLocalSGDConfig(ProcessGroup pg) : process_group(std::move(pg)) {}

  /// The hook's state (shared, as post_localSGD_hook takes it).
  std::shared_ptr<PostLocalSGDState> make_hook_state() const;
  /// PeriodicModelAverager(period, start_localSGD_iter, process_group).
  std::unique_ptr<PeriodicModelAverager> make_averager() const;
};

class PostLocalSGDOptimizer {
 public:
  /// Takes ownership of both (null: ValueError).
  PostLocalSGDOptimizer(std::unique_ptr<Optimizer> optim, std::unique_ptr<ModelAverager> averager);
  /// Also checks the averager against the reducer hook's state
  /// (check_post_local_sgd_schedule); the state is not kept.
  PostLocalSGDOptimizer(std::unique_ptr<Optimizer> optim, std::unique_ptr<ModelAverager> averager,
                        const PostLocalSGDState& hook_state);
  /// Waits for a step_async() in flight (its error dropped).
  ~PostLocalSGDOptimizer();
  PostLocalSGDOptimizer(const PostLocalSGDOptimizer&) = delete;
  PostLocalSGDOptimizer& operator=(const PostLocalSGDOptimizer&) = delete;

  /// Waits for a step_async() in flight (header), then the local step, then
  /// averager().average_parameters(param_groups()).
  void step();
  /// The local step here, the average in the background (see the header).
  /// Errors of the local step are thrown here.
  Future<void> step_async();
  /// A step without the local update, for a step that every rank skips (a
  /// loss scaler found inf/NaN gradients on some rank, GradScaler::step):
  /// the averager still runs, averaging the parameters if this step is one
  /// of its averaging steps, and its counter advances. So the schedule stays
  /// aligned with the iterations on every rank, and with the comm hook's
  /// start_localSGD_iter (torch skips the whole step(), so a rank that skips
  /// falls one step behind the others' averaging schedule and later averages
  /// against different steps). A collective on averaging steps, like step().
  void skip_step();
  /// Survive a lost rank (see the header). `on_membership_change` empty:
  /// step() throws MembershipChangedError after recovering. The averager
  /// must be a PeriodicModelAverager (NotSupportedError otherwise).
  void enable_survive(std::function<void(const ZeroRecovery&)> on_membership_change = {});
  bool survives() const noexcept { return survive_; }
  /// After a PeerLostError outside step() (e.g. the trainer's gradient
  /// all-reduce): a collective of the survivors, between steps. Shrinks the
  /// averager's group (or takes `shrunk`, the survivors' group when the
  /// trainer already shrank that same group), checks that every survivor
  /// stopped after the same step, and averages over the survivors from now
  /// on. Nothing is averaged (step_completed = false). StateError without
  /// enable_survive().
  ZeroRecovery recover(std::optional<ProcessGroup> shrunk = std::nullopt);

  /// How many calls of step() / skip_step() there were.
  std::int64_t steps_taken() const noexcept { return steps_taken_; }
  std::int64_t steps_skipped() const noexcept { return steps_skipped_; }
  /// Does not wait for a step_async() in flight (gradients only).
  void zero_grad(bool set_to_none = false) { optim_->zero_grad(set_to_none); }
  void add_param_group(OptimizerParamGroup group) {
    settle("PostLocalSGDOptimizer.add_param_group");
    optim_->add_param_group(std::move(group));
  }

  /// The local optimizer's (the same objects).
  std::vector<OptimizerParamGroup>& param_groups() noexcept { return optim_->param_groups(); }
  const std::vector<OptimizerParamGroup>& param_groups() const noexcept { return optim_->param_groups(); }
  std::unordered_map<const TensorImpl*, ParamState>& state() noexcept { return optim_->state(); }
  const std::unordered_map<const TensorImpl*, ParamState>& state() const noexcept { return optim_->state(); }

  /// The local optimizer's dict plus metadata["step"] = averager().step(),
  /// plus the averager's own state (ModelAverager::save_state).
  StateDict state_dict() const;
  /// Loads the local optimizer's part; restores the averager's step from
  /// metadata["step"], or, when it is missing, warns on stderr ("Loaded state
  /// dict does not contain a step counter for an averager. Setting step
  /// counter to 0.") and sets it to 0. A step that is not a non-negative
  /// integer is a StateDictError.
  void load_state_dict(const StateDict& sd);

  Optimizer& optim() noexcept { return *optim_; }
  const Optimizer& optim() const noexcept { return *optim_; }
  ModelAverager& averager() noexcept { return *averager_; }
  const ModelAverager& averager() const noexcept { return *averager_; }

 private:
  std::unique_ptr<Optimizer> optim_;
  std::unique_ptr<ModelAverager> averager_;
  std::int64_t steps_taken_ = 0;
  std::int64_t steps_skipped_ = 0;
  bool survive_ = false;
  std::function<void(const ZeroRecovery&)> on_membership_change_;
  // step_async(): its average until settle() collected it, and, once one
  // failed (not with DiLoCo), what settle() reports from then on.
  mutable Future<void> in_flight_;
  mutable std::string failed_;

  friend void post_local_sgd_catch_up(PostLocalSGDOptimizer& opt, const GrowResult& grown);

  /// The averager's call of this step, with the survive path (header).
  void average(const char* op);
  /// step_async's averaging: in the background where the averager allows (header), else average(op).
  Future<void> average_async(const char* op);
  /// Rank thread, first in the calls that wait (header): waits for a
  /// step_async in flight; StateError naming `op` once one failed.
  void settle(const char* op) const;
};

/// Growing back (post_local_sgd_grow.cpp; docs/growing-back.md, "Growing
/// back"). Who calls: every rank of grown.group (what grow() returned to the
/// members, join_group() to the newcomers), once, on its rank thread, at the
/// same step boundary (a step_async() in flight is waited for first). A
/// collective over grown.group, point to point; it returns once this rank's
/// sends and receives completed.
///  - A member passes the optimizer it trains with, whose averager's group is
///    the group that grew; it goes on averaging over grown.group
///    (ModelAverager::take_grown_group). Nothing of its own changes.
///  - A newcomer passes a fresh optimizer over the same parameter list (same
///    shapes, dtypes, groups, optimizer kind) with its averager built alike
///    over grown.group (the averagers' configurations are compared first:
///    one of another kind or configuration raises ValueError on every
///    rank). From the lowest-ranked member of grown.group it receives the
///    parameters' values and that member's state_dict() (its
///    local optimizer's state and hyperparameters, the averager's step and
///    own state: DiLoCo's anchors, outer state, an average in flight), then
///    steps_taken() and steps_skipped(). The local optimizer's state differs
///    from rank to rank (each steps on its own gradients); the newcomer gets
///    the lowest-ranked member's, the same rank whose parameters it gets, so
///    it starts as an exact copy of one rank that was there.
/// Not sent: survives() and the callback (a newcomer calls enable_survive()
/// itself). On a member, once caught up, the on_membership_change callback
/// of enable_survive() (when set) is called with the join
/// (ZeroRecovery::joined, recovery.hpp; step = steps_taken() +
/// steps_skipped(), step_completed false); without one nothing is thrown.
/// Errors, naming "post_local_sgd_catch_up" and the rank: ValueError for grown.group invalid or without
/// this rank, a member whose averager's group is not the one that grew, a newcomer whose averager is not
/// over grown.group or is built otherwise than the members' (kind, period or level map, warm-up: every rank
/// raises it, naming the newcomer and both, in one all_gather before anything is sent; a newcomer's
/// HierarchicalModelAverager raises it from its constructor, averagers.hpp), a HierarchicalModelAverager
/// level whose group size does not divide the grown group's; NotSupportedError for an averager that cannot
/// take a grown group; on a newcomer, StateDictError when the member's state does not fit its optimizer
/// (load_state_dict's); the group's errors (PeerLostError, TimeoutError) from the sends and receives.
void post_local_sgd_catch_up(PostLocalSGDOptimizer& opt, const GrowResult& grown);

// --- with the single-rank training utilities of dopt/optim/ ------------------
class GradScaler;
class ParamGroupAccess;

/// clip_grad_norm (clip_grad.hpp): local clipping of this rank's gradients
/// (the ranks hold different gradients by design; no communication).
double clip_grad_norm(PostLocalSGDOptimizer& optimizer, double max_norm, const ClipGradNormOptions& options = {});
/// GradScaler (grad_scaler.hpp): agrees on inf/NaN over the averager's
/// group; a skipped step still runs the averager (skip_step).
void grad_scaler_unscale(GradScaler& scaler, PostLocalSGDOptimizer& optimizer);
bool grad_scaler_step(GradScaler& scaler, PostLocalSGDOptimizer& optimizer);
/// LR schedulers (lr_scheduler.hpp) drive the local optimizer's groups.
std::shared_ptr<ParamGroupAccess> schedule_access(PostLocalSGDOptimizer& optimizer);

}  // namespace dopt::optim
