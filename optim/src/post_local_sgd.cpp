#include "dopt/runtime/notice.hpp"
#include "dopt/optim/post_local_sgd.hpp"

#include <cstdio>
#include <string>

namespace dopt::optim {

void check_post_local_sgd_schedule(const PostLocalSGDState& state, const ModelAverager& averager) {
  if (state.start_localSGD_iter != averager.warmup_steps())
    throw ValueError("post-local SGD",
                     "the comm hook's PostLocalSGDState.start_localSGD_iter = " +
                         std::to_string(state.start_localSGD_iter) + " differs from the averager's warmup_steps = " +
                         std::to_string(averager.warmup_steps()) +
                         "; they must be equal (build both from one PostLocalSGDConfig)");
}

std::shared_ptr<PostLocalSGDState> PostLocalSGDConfig::make_hook_state() const {
  return std::make_shared<PostLocalSGDState>(process_group, subgroup, start_localSGD_iter,
                                             post_local_gradient_allreduce);
}

std::unique_ptr<PeriodicModelAverager> PostLocalSGDConfig::make_averager() const {
  return std::make_unique<PeriodicModelAverager>(period, start_localSGD_iter, process_group);
}

PostLocalSGDOptimizer::PostLocalSGDOptimizer(std::unique_ptr<Optimizer> optim, std::unique_ptr<ModelAverager> averager)
    : optim_(std::move(optim)), averager_(std::move(averager)) {
  if (!optim_) throw ValueError("PostLocalSGDOptimizer", "the local optimizer is null");
  if (!averager_) throw ValueError("PostLocalSGDOptimizer", "the averager is null");
}

PostLocalSGDOptimizer::PostLocalSGDOptimizer(std::unique_ptr<Optimizer> optim, std::unique_ptr<ModelAverager> averager,
                                             const PostLocalSGDState& hook_state)
    : PostLocalSGDOptimizer(std::move(optim), std::move(averager)) {
  check_post_local_sgd_schedule(hook_state, *averager_);
}

void PostLocalSGDOptimizer::step() {
  optim_->step();
  averager_->average_parameters(optim_->param_groups());
  ++steps_taken_;
}

void PostLocalSGDOptimizer::skip_step() {
  // No local update, but the averager keeps its schedule: it averages when
  // this step is due (every rank skips together, so the collective matches)
  // and counts the step.
  averager_->average_parameters(optim_->param_groups());
  ++steps_skipped_;
}

StateDict PostLocalSGDOptimizer::state_dict() const {
  StateDict sd = optim_->state_dict();
  sd.metadata[kAveragerStepKey] = std::to_string(averager_->step());
  averager_->save_state(sd);
  return sd;
}

void PostLocalSGDOptimizer::load_state_dict(const StateDict& sd) {
  static constexpr const char* op = "PostLocalSGDOptimizer.load_state_dict";
  std::optional<std::int64_t> step;
  if (auto it = sd.metadata.find(kAveragerStepKey); it != sd.metadata.end()) {
    const std::string& s = it->second;
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (s.empty() || used != s.size() || v < 0)
      throw StateDictError(op, "the averager step '" + s + "' is not a non-negative integer");
    step = v;
  }
  // The averager's own entries (DiLoCo's anchors, ...) come out first; the
  // rest is the local optimizer's.
  StateDict local = sd;
  averager_->load_state(local);
  optim_->load_state_dict(local);
  if (step) {
    averager_->set_step(*step);
  } else {
    notice("PostLocalSGDOptimizer.load_state_dict: the state dict has no step counter for the averager; "
           "the averager starts again at step 0");
    averager_->set_step(0);
  }
}

}  // namespace dopt::optim
