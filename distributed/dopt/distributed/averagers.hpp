#pragma once
// Model averaging: torch 1.13's torch.distributed.algorithms.model_averaging
// (utils.average_parameters, ModelAverager, PeriodicModelAverager,
// HierarchicalModelAverager).
//
//   PeriodicModelAverager averager(/*period=*/4, /*warmup_steps=*/100, ctx.world());
//   for (...) { ...; opt.step(); averager.average_parameters(opt.param_groups()); }
//
// Arithmetic (bitwise torch's): the result is sum_r (p_r / n), not
// (sum_r p_r) / n: every rank's parameters of one dtype, seen as one flat
// buffer, are divided by the group size in their dtype and summed over the
// ranks in gloo's ring order (what torch 1.13 runs on CPU; for 3 or more
// ranks of float32/float64 this order matters). On CPU tensors this is one
// ProcessGroup::all_reduce_coalesced per dtype, reading and writing the
// parameters themselves (no flat copy); the async form returns at once and
// its future completes when every dtype's call has. Device tensors take one
// flat buffer through the device backend.
//
// Collective contract. average_parameters (on an averager or the free
// functions) is a collective over the selected group when it averages: every
// member calls it in the same step with the same list of parameters to
// average (same count, dtypes and sizes, after the gradient filter below), or
// the all_reduce fails with CollectiveMismatchError. A rank that is not a
// member of the group returns without touching anything. The averagers'
// schedules depend only on their step counter, so ranks that construct them
// alike and call them once per optimizer step stay in step.
//
// Gradient filter (torch's get_params_to_average): only parameters whose
// grad() is defined are averaged. The overloads taking param groups average
// the groups' parameters with a gradient.
//
// Differences from torch (docs/post-local-sgd.md): one all_reduce per dtype
// (torch concatenates with type promotion); results are copied back into the
// parameters' own storage (torch re-points p.data at the flat buffer, breaking
// views such as ZeRO's bucket view); HierarchicalModelAverager takes an
// ordered std::map, so periods are always ascending; its subgroups are real
// dopt subgroups, also on CPU (torch 1.13 requires CUDA for new_subgroups).
//
// Devices: parameters may live on a device (CUDA after gpu::init()): the flat
// buffer is then allocated there (one per dtype and device), filled and read
// back with device copies and divided there (the device ops gpu/ registers, bitwise the
// CPU arithmetic); the sum is one all_reduce_async(SUM) through the device
// backend for every group size (NCCL's order, as torch on CUDA, not the
// ring above). PostLocalSGDOptimizer on device parameters thus runs the
// fused optimizer step and this average. The CPU path is unchanged.
//
// Not thread-safe: one thread per rank at a time.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "dopt/actors/future.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim {

/// Parameters with a defined gradient, in order (torch's get_params_to_average).
std::vector<Tensor> get_params_to_average(const std::vector<Tensor>& params);
std::vector<Tensor> get_params_to_average(const std::vector<OptimizerParamGroup>& groups);

/// Averages `params` over `group` (no gradient filter here): per dtype (and device), in
/// order of first appearance, one flat buffer, divided by group.size(), one
/// SUM reduction (see the header: ring order for >= 3 ranks). The returned future completes once every
/// parameter holds its average; until then the parameters must not be
/// touched. A non-member of the group gets a ready future and nothing
/// changes. Floating-point tensors only, on any device (TypeError otherwise; float16 and
/// bfloat16 are divided in float32 and rounded, like torch's Half math).
Future<void> average_parameters_async(const std::vector<Tensor>& params, ProcessGroup group);
/// Blocking form: average_parameters_async(...).get().
void average_parameters(const std::vector<Tensor>& params, ProcessGroup group);
/// torch's average_parameters_or_parameter_groups: filter by gradient, then average.
void average_parameters_or_parameter_groups(const std::vector<Tensor>& params, ProcessGroup group);
void average_parameters_or_parameter_groups(const std::vector<OptimizerParamGroup>& groups,
                                            ProcessGroup group);

/// Base of the averagers: a process group and a step counter.
class ModelAverager {
 public:
  virtual ~ModelAverager() = default;
  ModelAverager(const ModelAverager&) = delete;
  ModelAverager& operator=(const ModelAverager&) = delete;

  /// Averages (when the schedule says so, see the subclasses) the parameters
  /// with a gradient, then advances step() by one. A collective on averaging
  /// steps (header). Virtual so that an averager may do more than average
  /// (DiLoCoAverager, diloco.hpp, runs an outer optimizer).
  virtual void average_parameters(const std::vector<Tensor>& params);
  virtual void average_parameters(const std::vector<OptimizerParamGroup>& groups);
  /// average_parameters(groups) with the collective's completion left in the
  /// background (PostLocalSGDOptimizer::step_async, rank thread): the future
  /// is ready once the parameters hold their averaged values and carries the
  /// collective's error. Default: the blocking call, then a ready future.
  /// The averagers below whose average can complete in the background
  /// override it; a subclass that overrides average_parameters(groups)
  /// overrides this too (or step_async bypasses its override).
  virtual Future<void> average_parameters_async(const std::vector<OptimizerParamGroup>& groups);

  /// The averager's own state beyond step(), for PostLocalSGDOptimizer's
  /// state dict: save_state adds it to sd (entries of the parameters' state
  /// and metadata under a prefix of its own); load_state restores it and
  /// removes those entries from sd, leaving the local optimizer's part.
  /// Both do nothing here (the averagers above keep only their step).
  virtual void save_state(StateDict& sd) const;
  virtual void load_state(StateDict& sd);

  /// The group averaging would use at the current step; empty when this step
  /// does not average. Local, no communication.
  virtual std::optional<ProcessGroup> group_for_step(std::int64_t step) const = 0;
  /// Whether the next average_parameters call averages.
  bool will_average() const { return group_for_step(step_).has_value(); }

  /// Steps before the first averaging (both averagers have one).
  virtual std::int64_t warmup_steps() const noexcept = 0;

  /// Calls of average_parameters so far (torch's averager.step).
  std::int64_t step() const noexcept { return step_; }
  /// Restores the counter (PostLocalSGDOptimizer::load_state_dict). Negative: ValueError.
  void set_step(std::int64_t step);

  const ProcessGroup& process_group() const noexcept { return process_group_; }

  /// Surviving a lost rank (PostLocalSGDOptimizer's recovery,
  /// docs/fault-tolerance-optimizers.md): averages over `survivors` (the shrunk group,
  /// ProcessGroup::shrink()) from now on. Local. PeriodicModelAverager
  /// supports it; the others throw NotSupportedError (their subgroups, or
  /// DiLoCo's in-flight fragments, are built over the old group).
  virtual void replace_process_group(ProcessGroup survivors);
  /// Growing back (post_local_sgd_catch_up, post_local_sgd.hpp;
  /// docs/growing-back.md): averages over `grown`
  /// (ProcessGroup::grow()'s group of this group's members and the
  /// newcomers, or on a newcomer the group it was built over) from now on.
  /// Rank thread, at a step boundary. PeriodicModelAverager takes it
  /// (local); DiLoCoAverager first all-gathers its settings over `grown`
  /// (a collective: ValueError naming `op` on every rank when one differs)
  /// and waits for an average in flight (diloco.hpp);
  /// HierarchicalModelAverager rebuilds its subgroups over `grown` (a
  /// collective of the grown group, see there); an averager that
  /// overrides none of it throws NotSupportedError naming `op`.
  virtual void take_grown_group(ProcessGroup grown, const char* op);

 protected:
  /// An invalid group is a ValueError naming `op`.
  ModelAverager(ProcessGroup process_group, const char* op);
  /// The schedule of average_parameters(groups) with the average posted
  /// (the free average_parameters_async): the async form of the averagers
  /// whose average_parameters(groups) is this class's.
  Future<void> average_on_schedule_async(const std::vector<OptimizerParamGroup>& groups);
  void set_process_group(ProcessGroup g) { process_group_ = std::move(g); }

 private:
  ProcessGroup process_group_;
  std::int64_t step_ = 0;
};

/// Averages on process_group at steps warmup_steps, warmup_steps + period, ...
/// i.e. when step >= warmup_steps and (step - warmup_steps) % period == 0.
class PeriodicModelAverager : public ModelAverager {
 public:
  /// Errors in torch's order: warmup_steps < 0, then period < 1 (ValueError);
  /// period == 1 warns on stderr (plain data parallelism would do).
  PeriodicModelAverager(std::int64_t period, std::int64_t warmup_steps, ProcessGroup process_group);

  std::optional<ProcessGroup> group_for_step(std::int64_t step) const override;
  std::int64_t warmup_steps() const noexcept override { return warmup_steps_; }
  std::int64_t period() const noexcept { return period_; }
  /// The average posted, as average_parameters(groups) runs it.
  Future<void> average_parameters_async(const std::vector<OptimizerParamGroup>& groups) override {
    return average_on_schedule_async(groups);
  }
  /// Takes the survivors' group (see ModelAverager::replace_process_group).
  void replace_process_group(ProcessGroup survivors) override;
  /// Takes the grown group (see ModelAverager::take_grown_group).
  void take_grown_group(ProcessGroup grown, const char* op) override;

 private:
  std::int64_t period_;
  std::int64_t warmup_steps_;
};

/// Averages on groups of different sizes at different periods. For each
/// (period -> group size) entry, ascending periods: a group size equal to
/// process_group.size() uses process_group itself; a smaller one uses the
/// subgroups of contiguous blocks of size ranks of process_group
/// (process_group.new_subgroups(size) on the world group; on a group that
/// shrink() or grow() made, subgroups made among its members). From
/// warmup_steps on, a step averages on the group of the largest period
/// dividing the *absolute* step (torch: step % period, not (step - warmup) %
/// period).
///
/// The constructor is a collective over process_group when it creates
/// subgroups (one call per entry whose size differs from process_group's, in
/// ascending period order) and over any group but the world, whose ranks
/// first compare their maps and warm-ups (one all_gather; ValueError on every
/// rank when one differs, naming it and both). Other errors (ValueError): an
/// empty map; a first period < 1; the last group size != process_group.size();
/// a group size < 1 or not dividing it; warmup_steps < 0 (checked after the
/// subgroups were created, like torch). A last period of 1 warns on stderr.
/// Growing back (take_grown_group, through post_local_sgd_catch_up): the
/// levels are rebuilt over the grown group by the constructor's rule (the last
/// one the whole grown group, the others keeping their sizes), compared with
/// the newcomers' constructors' first; a collective of the grown group (every
/// member calls it; a newcomer's averager, built over it, does nothing). A size
/// not dividing the grown group's: ValueError naming `op`, before anything is
/// made or compared. A shrunk group is not taken: build a new averager over it.
class HierarchicalModelAverager : public ModelAverager {
 public:
  HierarchicalModelAverager(std::map<std::int64_t, int> period_group_size, std::int64_t warmup_steps,
                            ProcessGroup process_group);

  std::optional<ProcessGroup> group_for_step(std::int64_t step) const override;
  std::int64_t warmup_steps() const noexcept override { return warmup_steps_; }
  /// The average posted, as average_parameters(groups) runs it.
  Future<void> average_parameters_async(const std::vector<OptimizerParamGroup>& groups) override {
    return average_on_schedule_async(groups);
  }
  /// period -> the group this rank averages on at that period.
  const std::map<std::int64_t, ProcessGroup>& period_process_groups() const noexcept { return groups_; }
  /// Rebuilds the levels over the grown group (see the class comment).
  void take_grown_group(ProcessGroup grown, const char* op) override;

 private:
  static std::map<std::int64_t, ProcessGroup> make_levels(ProcessGroup pg,
                                                          const std::map<std::int64_t, int>& period_group_size,
                                                          const char* op);

  std::map<std::int64_t, int> period_group_size_;
  std::map<std::int64_t, ProcessGroup> groups_;
  std::int64_t warmup_steps_;
};

}  // namespace dopt::optim
