#pragma once
// Learning-rate schedulers: torch 1.13's torch.optim.lr_scheduler, with its
// arithmetic (the chainable formulas, in double, in torch's order), its
// construction-time step and its state dicts, for every dopt optimizer.
//
//   Adam opt(params, AdamOptions(1e-3));
//   StepLR sched(opt, /*step_size=*/30, /*gamma=*/0.1);
//   for (...) { ...gradients...; opt.step(); sched.step(); }
//
// A scheduler drives a ScheduleTarget, made implicitly from a local
// Optimizer, a ZeroRedundancyOptimizer (its param groups; every rank builds
// and steps the same scheduler, and step() hands the values to the owners'
// local optimizers), a PostLocalSGDOptimizer (its local optimizer), or a
// DistributedOptimizer (one group; each change reaches every remote owner
// in one round of messages, all owners at once, before step() returns).
// The optimizer must outlive the scheduler.
//
// Contract (as torch):
//  - Constructing a scheduler records each group's initial_lr (the first
//    scheduler on an optimizer sets it, later ones read it), takes the
//    initial step (last_epoch becomes 0) and may already change the groups'
//    values: what the first optimizer step uses.
//  - step() after each optimizer step: last_epoch += 1, new values.
//  - state_dict() / load_state_dict(): every field of the scheduler under
//    torch's names (load into a scheduler of the same class built on an
//    equivalent optimizer; a dict of another class is a StateDictError).
//    The values in the optimizer's groups are the optimizer's state, as in
//    torch: save and restore both.
//  - Not thread-safe; one thread at a time (with ZeRO: one per rank).
//
// Differences from torch 1.13 (docs/torch-differences.md): no warnings (the
// deprecated step(epoch) that SequentialLR uses at its milestones warns in
// torch); CyclicLR's state dict is plain data (torch's holds a weak
// reference and cannot be pickled); CyclicLR also cycles betas[0] of
// Adam-like optimizers (as OneCycleLR does); OneCycleLR's per-group
// initial_lr/max_lr/min_lr/momenta live in its state dict (torch keeps them
// in the optimizer's param groups); ReduceLROnPlateau has get_last_lr()
// from the start; resuming with a last_epoch other than -1 is done through
// load_state_dict.
#include <array>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dopt/optim/optimizer.hpp"
#include "dopt/runtime/hyperparams.hpp"

namespace dopt::optim {


/// A scheduler's state: torch's scheduler.state_dict(), name -> value
/// (numbers, flags, lists, strings). Nested schedulers (SequentialLR,
/// ChainedScheduler) store their children's entries under
/// "_schedulers.{i}.{name}". "_class" names the scheduler class.
using SchedulerStateDict = Hyperparams;

/// One entry of a scheduler's state dict beyond the base's: its key and the
/// member that holds it (integers are saved as numbers, as torch's JSON).
struct SchedulerField {
  const char* key;
  std::variant<double*, std::int64_t*, std::vector<std::int64_t>*> member;
};

/// What a scheduler reads and writes: the hyperparameters of each param
/// group of some optimizer. Implement it to schedule your own optimizer.
class ParamGroupAccess {
 public:
  virtual ~ParamGroupAccess() = default;
  /// The optimizer's name, for error messages.
  virtual std::string name() const = 0;
  /// The object scheduled (schedulers of one optimizer share it).
  virtual const void* identity() const = 0;
  virtual std::size_t num_groups() const = 0;
  /// Every hyperparameter of group g, under torch's names.
  virtual Hyperparams get(std::size_t g) const = 0;
  /// Overwrites the given hyperparameters of group g.
  virtual void set(std::size_t g, const Hyperparams& h) = 0;
  /// torch's param_group['initial_lr'] of group g (empty until a scheduler sets it).
  virtual std::optional<double>& initial_lr(std::size_t g) = 0;
  /// Makes the changes since the last commit take effect (DistributedOptimizer:
  /// sends them to every owner). Called after each scheduler step.
  virtual void commit() {}
};

/// The access to groups held as OptimizerParamGroups (a local optimizer,
/// ZeRO's global groups): `name` for messages, `identity` the object
/// scheduled. The groups must outlive the access.
std::shared_ptr<ParamGroupAccess> param_group_access(std::string name, const void* identity,
                                                     std::vector<OptimizerParamGroup>& groups);

/// An optimizer that optim does not know (ZeroRedundancyOptimizer,
/// PostLocalSGDOptimizer, DistributedOptimizer of dopt/distributed/) is a
/// schedule target when its header declares, in its own namespace,
///   std::shared_ptr<ParamGroupAccess> schedule_access(TheOptimizer&);
/// (found by argument-dependent lookup), so that optim depends on nothing above it.
template <class T>
concept HasScheduleAccess = requires(T& t) {
  { schedule_access(t) } -> std::convertible_to<std::shared_ptr<ParamGroupAccess>>;
};

/// A handle to what a scheduler drives (copies share it).
class ScheduleTarget {
 public:
  ScheduleTarget(Optimizer& optimizer);               // NOLINT(implicit)
  /// Any optimizer with a schedule_access (see HasScheduleAccess).
  template <class T>
    requires HasScheduleAccess<T>
  ScheduleTarget(T& optimizer) : ScheduleTarget(schedule_access(optimizer)) {}  // NOLINT(implicit)
  explicit ScheduleTarget(std::shared_ptr<ParamGroupAccess> access);

  std::string name() const { return access_->name(); }
  const void* identity() const { return access_->identity(); }
  std::size_t num_groups() const { return access_->num_groups(); }
  double lr(std::size_t g) const;
  void set_lr(std::size_t g, double lr);
  /// Whether the groups have a `momentum` / `betas` hyperparameter (group 0's).
  bool has_momentum() const;
  bool has_betas() const;
  double momentum(std::size_t g) const;
  void set_momentum(std::size_t g, double m);
  /// betas[0].
  double beta1(std::size_t g) const;
  void set_beta1(std::size_t g, double b);
  std::optional<double>& initial_lr(std::size_t g) { return access_->initial_lr(g); }
  /// Makes the changes take effect (DistributedOptimizer: one round of
  /// messages to the owners; nothing to do for local optimizers).
  void commit() { access_->commit(); }

 private:
  std::shared_ptr<ParamGroupAccess> access_;
};

/// torch's _LRScheduler: the base of every scheduler but ReduceLROnPlateau.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// "StepLR", ...
  const std::string& name() const noexcept { return name_; }
  /// One epoch on: last_epoch += 1, the chainable formula, the groups' lr
  /// (and momentum where the class cycles it) set, committed.
  virtual void step();
  /// torch's deprecated step(epoch): last_epoch = epoch and the closed form
  /// where the class has one (else the chainable formula). SequentialLR
  /// uses it at its milestones; no warning.
  virtual void step_to(std::int64_t epoch);
  /// The lr of every group after the last step.
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }
  ScheduleTarget& target() noexcept { return target_; }

  virtual SchedulerStateDict state_dict() const;
  /// Throws StateDictError for a dict of another class or a list of the
  /// wrong length, KeyError for a missing entry; nothing changes then.
  virtual void load_state_dict(const SchedulerStateDict& sd);

  /// Testing/composites: resets last_epoch and takes the initial step again
  /// (torch's _initial_step).
  void initial_step();
  /// SequentialLR: moves last_epoch without stepping.
  void set_last_epoch(std::int64_t e) noexcept { last_epoch_ = e; }

 protected:
  LRScheduler(std::string name, ScheduleTarget target);
  /// torch's _LRScheduler.__init__ with last_epoch = -1: each group's
  /// initial_lr defaults to its lr, base_lrs = the initial_lrs; then the
  /// initial step. Subclass constructors call it last.
  void start();
  /// The chainable formula at last_epoch (may set momentum itself).
  virtual std::vector<double> get_lr() = 0;
  /// The closed form at last_epoch, where the class has one.
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  /// Sets every group's lr, records last_lr, commits.
  void apply(const std::vector<double>& lrs);
  /// The current lr of every group.
  std::vector<double> group_lrs() const;
  /// Every lr of lrs times factor.
  static std::vector<double> scaled(std::vector<double> lrs, double factor);
  /// The subclass's own state-dict entries; save_fields and load_fields
  /// write and read them (a load reads every entry before it changes any).
  virtual std::vector<SchedulerField> state_fields() { return {}; }
  /// Subclasses with entries that are not plain fields add/read them here
  /// (called by state_dict/load_state_dict after the base's).
  virtual void save_fields(SchedulerStateDict& sd) const;
  virtual void load_fields(const SchedulerStateDict& sd);
  /// A per-group value: one value for every group, or one per group
  /// (ValueError naming `what` otherwise).
  std::vector<double> per_group(const std::vector<double>& v, const char* what) const;

  ScheduleTarget target_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  /// Set on the children of SequentialLR / ChainedScheduler: their steps do
  /// not commit; the composite commits once.
  bool defer_commit_ = false;
  friend class SequentialLR;
  friend class ChainedScheduler;

 private:
  std::string name_;
};

/// lr = base_lr * lambda(epoch) (one function, or one per group).
class LambdaLR : public LRScheduler {
 public:
  using Lambda = std::function<double(std::int64_t epoch)>;
  LambdaLR(ScheduleTarget target, Lambda lambda);
  LambdaLR(ScheduleTarget target, std::vector<Lambda> lambdas);

 protected:
  std::vector<double> get_lr() override;

 private:
  std::vector<Lambda> lambdas_;
};

/// lr *= gamma every step_size epochs.
class StepLR : public LRScheduler {
 public:
  StepLR(ScheduleTarget target, std::int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  std::vector<SchedulerField> state_fields() override;

 private:
  std::int64_t step_size_;
  double gamma_;
};

/// lr *= gamma at each milestone (a repeated milestone applies gamma once per repetition).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(ScheduleTarget target, std::vector<std::int64_t> milestones, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  std::vector<SchedulerField> state_fields() override;
  /// Sorts the loaded milestones.
  void load_fields(const SchedulerStateDict& sd) override;

 private:
  std::vector<std::int64_t> milestones_;  // sorted, with repetitions
  double gamma_;
};

/// lr * factor until total_iters, then lr. factor in [0, 1] (ValueError).
class ConstantLR : public LRScheduler {
 public:
  ConstantLR(ScheduleTarget target, double factor = 1.0 / 3, std::int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  std::vector<SchedulerField> state_fields() override;

 private:
  double factor_;
  std::int64_t total_iters_;
};

/// The factor goes linearly from start_factor to end_factor over total_iters
/// epochs (both in [0, 1], ValueError otherwise).
class LinearLR : public LRScheduler {
 public:
  LinearLR(ScheduleTarget target, double start_factor = 1.0 / 3, double end_factor = 1.0,
           std::int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  std::vector<SchedulerField> state_fields() override;

 private:
  double start_factor_, end_factor_;
  std::int64_t total_iters_;
};

/// lr *= gamma every epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(ScheduleTarget target, double gamma);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  std::vector<SchedulerField> state_fields() override;

 private:
  double gamma_;
};

/// lr = base_lr * (1 - epoch / total_iters)^power until total_iters.
class PolynomialLR : public LRScheduler {
 public:
  PolynomialLR(ScheduleTarget target, std::int64_t total_iters = 5, double power = 1.0);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  std::vector<SchedulerField> state_fields() override;

 private:
  std::int64_t total_iters_;
  double power_;
};

/// Cosine annealing from base_lr to eta_min over T_max epochs (recursive form).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(ScheduleTarget target, std::int64_t T_max, double eta_min = 0.0);

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  std::vector<SchedulerField> state_fields() override;

 private:
  std::int64_t T_max_;
  double eta_min_;
};

/// SGDR: cosine annealing restarted after T_0, T_0*T_mult, ... epochs.
/// T_0 >= 1, T_mult >= 1 (ValueError).
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(ScheduleTarget target, std::int64_t T_0, std::int64_t T_mult = 1, double eta_min = 0.0);
  void step() override;
  /// torch's step(epoch) with a (possibly fractional) epoch >= 0 (ValueError otherwise).
  void step_epoch(double epoch);
  void step_to(std::int64_t epoch) override { step_epoch(static_cast<double>(epoch)); }

 protected:
  std::vector<double> get_lr() override;
  std::vector<SchedulerField> state_fields() override;

 private:
  std::int64_t T_0_, T_mult_;
  double T_i_, T_cur_, eta_min_;
};

struct CyclicLROptions {
  /// Lower and upper lr boundaries: one value, or one per group (required).
  std::vector<double> base_lr, max_lr;
  double step_size_up = 2000;
  /// Empty: step_size_up.
  std::optional<double> step_size_down;
  /// "triangular", "triangular2" or "exp_range".
  std::string mode = "triangular";
  double gamma = 1.0;
  /// Cycle `momentum` (SGD, RMSprop) or betas[0] (Adam-like) inversely to the lr.
  bool cycle_momentum = true;
  std::vector<double> base_momentum = {0.8};
  std::vector<double> max_momentum = {0.9};
};

/// Cyclical learning rates (Smith), torch's three modes.
class CyclicLR : public LRScheduler {
 public:
  CyclicLR(ScheduleTarget target, CyclicLROptions options);

 protected:
  std::vector<double> get_lr() override;
  void save_fields(SchedulerStateDict& sd) const override;
  void load_fields(const SchedulerStateDict& sd) override;

 private:
  double scale_fn(double x) const;
  std::vector<double> max_lrs_, base_momentums_, max_momentums_;
  double total_size_, step_ratio_, gamma_;
  std::string mode_, scale_mode_;
  bool cycle_momentum_, use_beta1_ = false;
};

struct OneCycleLROptions {
  /// Peak lr: one value, or one per group (required).
  std::vector<double> max_lr;
  /// Either total_steps, or epochs and steps_per_epoch.
  std::optional<std::int64_t> total_steps, epochs, steps_per_epoch;
  double pct_start = 0.3;
  /// "cos" or "linear".
  std::string anneal_strategy = "cos";
  /// Cycle `momentum` (SGD, RMSprop) or betas[0] (Adam, AdamW, Adamax, NAdam, RAdam).
  bool cycle_momentum = true;
  std::vector<double> base_momentum = {0.85};
  std::vector<double> max_momentum = {0.95};
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

/// The 1cycle policy (Smith & Topin). Stepping past total_steps is a ValueError.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(ScheduleTarget target, OneCycleLROptions options);
  std::int64_t total_steps() const noexcept { return total_steps_; }

 protected:
  std::vector<double> get_lr() override;
  void save_fields(SchedulerStateDict& sd) const override;
  void load_fields(const SchedulerStateDict& sd) override;

 private:
  struct Phase {
    double end_step;
    int start_lr, end_lr, start_momentum, end_momentum;  // indices into the per-group values below
  };
  double anneal(double start, double end, double pct) const;
  std::int64_t total_steps_;
  bool cos_, cycle_momentum_, use_beta1_ = false, three_phase_;
  std::vector<Phase> phases_;
  // per group: 0 initial_lr, 1 max_lr, 2 min_lr, 3 max_momentum, 4 base_momentum
  std::vector<std::array<double, 5>> values_;
};

/// Runs children one after another: child i from milestone i-1 on. The
/// children must be built on the same optimizer (ValueError), in order,
/// before the SequentialLR; it owns them.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(ScheduleTarget target, std::vector<std::unique_ptr<LRScheduler>> schedulers,
               std::vector<std::int64_t> milestones);
  void step() override;
  SchedulerStateDict state_dict() const override;
  void load_state_dict(const SchedulerStateDict& sd) override;
  const std::vector<std::unique_ptr<LRScheduler>>& schedulers() const noexcept { return schedulers_; }

 protected:
  std::vector<double> get_lr() override { return group_lrs(); }

 private:
  std::vector<std::unique_ptr<LRScheduler>> schedulers_;
  std::vector<std::int64_t> milestones_;
};

/// Steps every child at each step, in order (their effects multiply). The
/// children must share one optimizer (ValueError); it owns them.
class ChainedScheduler : public LRScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::unique_ptr<LRScheduler>> schedulers);
  void step() override;
  SchedulerStateDict state_dict() const override;
  void load_state_dict(const SchedulerStateDict& sd) override;
  const std::vector<std::unique_ptr<LRScheduler>>& schedulers() const noexcept { return schedulers_; }

 protected:
  std::vector<double> get_lr() override { return group_lrs(); }

 private:
  std::vector<std::unique_ptr<LRScheduler>> schedulers_;
};

struct ReduceLROnPlateauOptions {
  /// "min" (the metric should fall) or "max".
  std::string mode = "min";
  /// new lr = lr * factor (< 1, ValueError otherwise).
  double factor = 0.1;
  std::int64_t patience = 10;
  double threshold = 1e-4;
  /// "rel" or "abs".
  std::string threshold_mode = "rel";
  std::int64_t cooldown = 0;
  /// One value, or one per group.
  std::vector<double> min_lr = {0.0};
  /// Reductions smaller than eps are ignored.
  double eps = 1e-8;
};

/// Lowers the lr when a metric stops improving (torch's ReduceLROnPlateau,
/// which is not an _LRScheduler: step takes the metric).
class ReduceLROnPlateau {
 public:
  ReduceLROnPlateau(ScheduleTarget target, ReduceLROnPlateauOptions options = {});
  /// One epoch with this metric value.
  void step(double metric);
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  double best() const noexcept { return best_; }
  std::int64_t num_bad_epochs() const noexcept { return num_bad_epochs_; }
  bool in_cooldown() const noexcept { return cooldown_counter_ > 0; }
  SchedulerStateDict state_dict() const;
  void load_state_dict(const SchedulerStateDict& sd);

 private:
  bool is_better(double a, double best) const;
  ScheduleTarget target_;
  ReduceLROnPlateauOptions o_;
  std::vector<double> min_lrs_;
  double best_, mode_worse_;
  std::int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
  std::vector<double> last_lr_;
};

}  // namespace dopt::optim
