#include "dopt/runtime/notice.hpp"
#include "dopt/distributed/post_local_sgd.hpp"

#include <cstdio>
#include <string>

#include "dopt/distributed/diloco.hpp"
#include "dopt/optim/internal/state_load.hpp"
#include "survive/step_in_flight.hpp"
#include "survive/survive_util.hpp"
#include "dopt/actors/internal/call_label.hpp"

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

PostLocalSGDOptimizer::~PostLocalSGDOptimizer() {
  if (in_flight_.valid()) in_flight_.wait();  // the average writes into the parameters; its error is dropped
}

void PostLocalSGDOptimizer::settle(const char* op) const {
  // DiLoCo's failed fragment is back at its anchors: nothing differs between the ranks.
  const bool keep_error = !dynamic_cast<const DiLoCoAverager*>(averager_.get());
  detail::settle_in_flight(in_flight_, failed_,
                           "the average of step_async() (averager step " + std::to_string(averager_->step() - 1) + ")",
                           keep_error, op, averager_->process_group().rank());
}

void PostLocalSGDOptimizer::step() {
  dopt::detail::CallScope call_scope("PostLocalSGDOptimizer::step()");
  settle("PostLocalSGDOptimizer.step");
  optim_->step();
  ++steps_taken_;
  average("PostLocalSGDOptimizer.step");
}

Future<void> PostLocalSGDOptimizer::step_async() {
  dopt::detail::CallScope call_scope("PostLocalSGDOptimizer::step_async()");
  static constexpr const char* op = "PostLocalSGDOptimizer.step_async";
  settle(op);
  optim_->step();
  ++steps_taken_;
  in_flight_ = average_async(op);
  return in_flight_;
}

Future<void> PostLocalSGDOptimizer::average_async(const char* op) {
  ModelAverager& a = *averager_;
  const auto& groups = optim_->param_groups();
  // The averager's async form (a blocking average and a ready future for
  // those without one); surviving averages block (header).
  if (!survive_) return a.average_parameters_async(groups);
  average(op);  // completes here (header)
  return make_ready_future();
}

void PostLocalSGDOptimizer::skip_step() {
  dopt::detail::CallScope call_scope("PostLocalSGDOptimizer::skip_step()");
  settle("PostLocalSGDOptimizer.skip_step");
  // No local update, but the averager keeps its schedule: it averages when
  // this step is due (every rank skips together, so the collective matches)
  // and counts the step.
  ++steps_skipped_;
  average("PostLocalSGDOptimizer.skip_step");
}

void PostLocalSGDOptimizer::enable_survive(std::function<void(const ZeroRecovery&)> on_membership_change) {
  settle("PostLocalSGDOptimizer.enable_survive");
  if (!dynamic_cast<PeriodicModelAverager*>(averager_.get()))
    throw NotSupportedError("PostLocalSGDOptimizer.enable_survive",
                            "only a PeriodicModelAverager can go on over the survivors' group (the hierarchical "
                            "averager's subgroups and DiLoCo's fragments are built over the old group)",
                            averager_->process_group().rank());
  survive_ = true;
  on_membership_change_ = std::move(on_membership_change);
}

void PostLocalSGDOptimizer::average(const char* op) {
  if (!survive_ || !averager_->will_average()) return averager_->average_parameters(optim_->param_groups());
  // The parameters as this rank contributes them, for averaging them again
  // over the survivors when a member is lost during the average.
  const std::vector<Tensor> params = get_params_to_average(optim_->param_groups());
  std::vector<Tensor> kept;
  kept.reserve(params.size());
  for (const auto& p : params) kept.push_back(p.clone());
  try {
    averager_->average_parameters(optim_->param_groups());
    return;
  } catch (const PeerLostError&) {
    // recovered below (the averager's step was not counted)
  }
  ProcessGroup group = averager_->process_group();
  const std::int64_t at = averager_->step();
  ZeroRecovery rec = detail::shrink_and_redo(group, op, {at, 1}, [&](ProcessGroup& ng) {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(kept[i]);
    average_parameters(params, ng);
  });
  averager_->replace_process_group(rec.group);
  averager_->set_step(at + 1);
  rec.step = steps_taken_ + steps_skipped_;
  rec.step_completed = true;
  if (on_membership_change_) return on_membership_change_(rec);
  throw MembershipChangedError(op,
                               "rank(s) of the averager's group were lost; this step's parameters were averaged "
                               "again over the survivors' group (recovery().group), which averages from now on",
                               rec, rec.group.rank());
}

ZeroRecovery PostLocalSGDOptimizer::recover(std::optional<ProcessGroup> shrunk) {
  dopt::detail::CallScope call_scope("PostLocalSGDOptimizer::recover()");
  static constexpr const char* op = "PostLocalSGDOptimizer.recover";
  settle(op);
  if (!survive_) throw StateError(op, "recovery needs enable_survive()", averager_->process_group().rank());
  const std::int64_t at = averager_->step();
  ZeroRecovery rec;
  if (shrunk) {
    ProcessGroup ng = *shrunk;
    detail::check_same_point(ng, op, {at, 0}, ng.global_rank(ng.rank()));
    rec.group = ng;
  } else {
    ProcessGroup group = averager_->process_group();
    rec = detail::shrink_and_redo(group, op, {at, 0}, {});
  }
  averager_->replace_process_group(rec.group);
  rec.step = steps_taken_ + steps_skipped_;
  rec.step_completed = false;
  return rec;
}

StateDict PostLocalSGDOptimizer::state_dict() const {
  dopt::detail::CallScope call_scope("PostLocalSGDOptimizer::state_dict()");
  settle("PostLocalSGDOptimizer.state_dict");
  StateDict sd = optim_->state_dict();
  sd.metadata[kAveragerStepKey] = std::to_string(averager_->step());
  averager_->save_state(sd);
  return sd;
}

void PostLocalSGDOptimizer::load_state_dict(const StateDict& sd) {
  dopt::detail::CallScope call_scope("PostLocalSGDOptimizer::load_state_dict()");
  static constexpr const char* op = "PostLocalSGDOptimizer.load_state_dict";
  settle(op);
  std::optional<std::int64_t> step;
  if (auto it = sd.metadata.find(kAveragerStepKey); it != sd.metadata.end()) {
    step = detail::parse_count(it->second, op, "the averager step");
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
