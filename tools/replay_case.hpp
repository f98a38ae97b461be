#pragma once
// Internal to tools/: loading and replaying one conformance case
// (../shared/conformance/FORMAT.md, format "dopt-trace/1").
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/optim/optimizer.hpp"
#include "dopt/runtime/hyperparams.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::replay {

/// The largest world_size a case may ask for (each simulated rank is a thread).
inline constexpr int kMaxReplayWorldSize = 1024;

struct CaseGroup {
  std::vector<std::int64_t> params;  // global indices, in the group's order
  Hyperparams overrides;             // every key except "params"
};

struct Case {
  std::string dir;
  std::string name;
  DType dtype = DType::float32;
  int world_size = 1;  // 1..kMaxReplayWorldSize
  int steps = 0;
  std::vector<Shape> shapes;  // params[i].shape
  std::string optimizer_class;
  Hyperparams defaults;
  std::vector<CaseGroup> groups;
  std::string wrapper_kind;  // "local", "zero", "post_local_sgd", "diloco"
  /// wrapper.lr_scheduler as JSON text ({"class": ..., "args": {...}}); empty: none.
  std::string lr_scheduler;
  /// wrapper.clip_grad_norm: max_norm and norm_type (infinity for "inf").
  struct Clip {
    double max_norm = 0;
    double norm_type = 2.0;
  };
  std::optional<Clip> clip_grad_norm;
  std::map<std::string, Tensor> tensors;  // init.*, grad.*, metric.*, and the expected values
};

/// Reads CASE_DIR/case.json and CASE_DIR/tensors.safetensors and checks their
/// structure (every parameter in exactly one group, init.{i} present with the
/// declared shape and the case dtype). Throws dopt::IOError / dopt::ValueError
/// naming the file and the problem.
Case load_case(const std::string& dir);

/// Thrown for a well-formed case the replayer cannot run yet (e.g. wrapper 'zero').
class UnsupportedCase : public NotSupportedError {
 public:
  using NotSupportedError::NotSupportedError;
};

/// The case's param groups over `params` (indexed by global index), in order,
/// each with the defaults updated by its overrides.
std::vector<optim::OptimizerParamGroup> case_param_groups(const Case& c, const std::vector<Tensor>& params);

/// Builds the case's optimizer over `params` (indexed by global index) with
/// its groups, in order, each with the defaults updated by its overrides,
/// through the optimizer registry (dopt/optim/registry.hpp).
std::unique_ptr<optim::Optimizer> make_case_optimizer(const Case& c, const std::vector<Tensor>& params);

/// Sets params[i]'s gradient to the case's grad.{t}.{r}.{i} (a copy), or to
/// none where the case omits it. Throws IOError for one of the wrong shape or dtype.
void set_case_grads(const Case& c, int t, int r, const std::vector<Tensor>& params);
/// out["param.{t}.{r}.{i}"] = a copy of params[i], for every i.
void record_case_params(int t, int r, const std::vector<Tensor>& params, std::map<std::string, Tensor>& out);

struct ReplayOutput {
  std::map<std::string, Tensor> tensors;  // param.{t}.{r}.{i}, state.{r}.{i}.{key}
  std::map<std::string, std::string> metadata;
};

/// Replays the case: dispatches on c.wrapper_kind ("local" here, "zero" and
/// "post_local_sgd" below; an unknown kind throws UnsupportedCase).
/// num_threads is passed to Optimizer::set_num_threads.
ReplayOutput replay_case(const Case& c, int num_threads = 1);

/// A case's learning-rate scheduler (wrapper.lr_scheduler) built on `target`,
/// stepped after every optimizer step and recorded as sched.* (replay_schedule.cpp).
class CaseScheduler {
 public:
  /// Builds it (the construction steps it once); throws UnsupportedCase for a
  /// class or argument it does not know. `has_momentum` / `has_betas`: the
  /// optimizer's hyperparameters, which decide the recorded names.
  CaseScheduler(const Case& c, optim::ScheduleTarget target);
  ~CaseScheduler();
  /// scheduler.step() after optimizer step t (ReduceLROnPlateau: with metric.{t}).
  void step(int t);
  /// out["sched.{tag}.{g}.{name}"] for every group and recorded name (F64 0-d).
  void record(const std::string& tag, std::map<std::string, Tensor>& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Clips the gradients of `params` (index order) as the case says and
/// records grad_norm.{t}.{r} in the case dtype; nothing without clip_grad_norm.
void clip_case_grads(const Case& c, int t, int r, const std::vector<Tensor>& params,
                     std::map<std::string, Tensor>& out);
/// out["grad_norm.{t}.{r}"] = total as a 0-d tensor of the case dtype.
void record_grad_norm(const Case& c, int t, int r, double total, std::map<std::string, Tensor>& out);

/// Wrapper "zero": ZeroRedundancyOptimizer with world_size simulated ranks
/// (tools/replay_zero.cpp).
ReplayOutput replay_zero(const Case& c, int num_threads);
/// Wrapper "post_local_sgd": PostLocalSGDOptimizer + PeriodicModelAverager
/// with world_size simulated ranks (tools/replay_post_local_sgd.cpp).
ReplayOutput replay_post_local_sgd(const Case& c, int num_threads);
/// Wrapper "diloco": PostLocalSGDOptimizer + DiLoCoAverager with world_size
/// simulated ranks; also records anchor.* and outer.* (tools/replay_diloco.cpp).
ReplayOutput replay_diloco(const Case& c, int num_threads);

}  // namespace dopt::replay
