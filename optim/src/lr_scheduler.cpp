// The scheduler base (torch's _LRScheduler), the schedule targets, and the
// composite schedulers (lr_scheduler.hpp). The single schedulers are in
// lr_schedulers.cpp.
#include "dopt/optim/lr_scheduler.hpp"

#include <algorithm>
#include <type_traits>
#include <variant>

#include "scheduler_util.hpp"

namespace dopt::optim {
namespace {

/// Groups held as OptimizerParamGroups (a local optimizer, ZeRO's global groups).
class GroupsAccess : public ParamGroupAccess {
 public:
  GroupsAccess(std::string name, const void* id, std::vector<OptimizerParamGroup>& groups)
      : name_(std::move(name)), id_(id), groups_(groups) {}
  std::string name() const override { return name_; }
  const void* identity() const override { return id_; }
  std::size_t num_groups() const override { return groups_.size(); }
  Hyperparams get(std::size_t g) const override { return groups_.at(g).options->to_hyperparams(); }
  void set(std::size_t g, const Hyperparams& h) override { groups_.at(g).options->set_hyperparams(h); }
  std::optional<double>& initial_lr(std::size_t g) override { return groups_.at(g).initial_lr; }

 private:
  std::string name_;
  const void* id_;
  std::vector<OptimizerParamGroup>& groups_;
};

}  // namespace

// --- ScheduleTarget --------------------------------------------------------------

std::shared_ptr<ParamGroupAccess> param_group_access(std::string name, const void* identity,
                                                     std::vector<OptimizerParamGroup>& groups) {
  return std::make_shared<GroupsAccess>(std::move(name), identity, groups);
}

ScheduleTarget::ScheduleTarget(Optimizer& o)
    : access_(std::make_shared<GroupsAccess>(o.name(), &o, o.param_groups())) {}
ScheduleTarget::ScheduleTarget(std::shared_ptr<ParamGroupAccess> access) : access_(std::move(access)) {
  if (!access_) throw ValueError("ScheduleTarget", "the param group access is null");
}

double ScheduleTarget::lr(std::size_t g) const { return hyper_number(access_->get(g), "lr", "lr_scheduler"); }
void ScheduleTarget::set_lr(std::size_t g, double lr) { access_->set(g, {{"lr", lr}}); }
bool ScheduleTarget::has_momentum() const { return num_groups() > 0 && access_->get(0).count("momentum"); }
bool ScheduleTarget::has_betas() const { return num_groups() > 0 && access_->get(0).count("betas"); }
double ScheduleTarget::momentum(std::size_t g) const {
  return hyper_number(access_->get(g), "momentum", "lr_scheduler");
}
void ScheduleTarget::set_momentum(std::size_t g, double m) { access_->set(g, {{"momentum", m}}); }
double ScheduleTarget::beta1(std::size_t g) const {
  return hyper_pair(access_->get(g), "betas", "lr_scheduler")[0];
}
void ScheduleTarget::set_beta1(std::size_t g, double b) {
  auto betas = hyper_pair(access_->get(g), "betas", "lr_scheduler");
  betas[0] = b;
  access_->set(g, {{"betas", betas}});
}

// --- LRScheduler -------------------------------------------------------------------

LRScheduler::LRScheduler(std::string name, ScheduleTarget target) : target_(std::move(target)), name_(std::move(name)) {
  if (target_.num_groups() == 0) throw ValueError(name_, target_.name() + " has no param groups");
}

void LRScheduler::start() {
  base_lrs_.clear();
  for (std::size_t g = 0; g < target_.num_groups(); ++g) {
    std::optional<double>& initial = target_.initial_lr(g);
    if (!initial) initial = target_.lr(g);
    base_lrs_.push_back(*initial);
  }
  last_epoch_ = -1;
  initial_step();
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  step();
}

void LRScheduler::step() {
  ++step_count_;
  ++last_epoch_;
  apply(get_lr());
}

void LRScheduler::step_to(std::int64_t epoch) {
  ++step_count_;
  last_epoch_ = epoch;
  auto closed = closed_form_lr();
  apply(closed ? *closed : get_lr());
}

std::vector<double> LRScheduler::scaled(std::vector<double> lrs, double factor) {
  for (auto& lr : lrs) lr = lr * factor;
  return lrs;
}

std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> out;
  for (std::size_t g = 0; g < target_.num_groups(); ++g) out.push_back(target_.lr(g));
  return out;
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  for (std::size_t g = 0; g < lrs.size() && g < target_.num_groups(); ++g) target_.set_lr(g, lrs[g]);
  last_lr_ = group_lrs();
  if (!defer_commit_) target_.commit();
}

std::vector<double> LRScheduler::per_group(const std::vector<double>& v, const char* what) const {
  const std::size_t n = target_.num_groups();
  if (v.size() == 1) return std::vector<double>(n, v[0]);
  if (v.size() != n)
    throw ValueError(name_, "expected " + std::to_string(n) + " values for " + what + ", got " +
                                std::to_string(v.size()));
  return v;
}

void LRScheduler::save_fields(SchedulerStateDict& sd) const {
  // state_fields hands out the members to write as well as to read.
  for (const auto& f : const_cast<LRScheduler*>(this)->state_fields()) {
    std::visit(
        [&](auto* m) {
          using M = std::remove_pointer_t<decltype(m)>;
          if constexpr (std::is_same_v<M, double>) sd[f.key] = *m;
          else if constexpr (std::is_same_v<M, std::int64_t>) sd[f.key] = static_cast<double>(*m);
          else sd[f.key] = detail::to_doubles(*m);
        },
        f.member);
  }
}

void LRScheduler::load_fields(const SchedulerStateDict& sd) {
  const std::string op = name_ + ".load_state_dict";
  const auto fields = state_fields();
  // Read every entry before changing any: a bad dict changes nothing.
  std::vector<std::variant<double, std::int64_t, std::vector<std::int64_t>>> values;
  for (const auto& f : fields) {
    std::visit(
        [&](auto* m) {
          using M = std::remove_pointer_t<decltype(m)>;
          if constexpr (std::is_same_v<M, double>) values.emplace_back(detail::sd_number(sd, f.key, op));
          else if constexpr (std::is_same_v<M, std::int64_t>) values.emplace_back(detail::sd_int(sd, f.key, op));
          else values.emplace_back(detail::sd_ints(sd, f.key, op));
        },
        f.member);
  }
  for (std::size_t i = 0; i < fields.size(); ++i)
    std::visit([&](auto* m) { *m = std::get<std::remove_pointer_t<decltype(m)>>(values[i]); }, fields[i].member);
}

SchedulerStateDict LRScheduler::state_dict() const {
  SchedulerStateDict sd;
  sd["_class"] = name_;
  sd["last_epoch"] = static_cast<double>(last_epoch_);
  sd["_step_count"] = static_cast<double>(step_count_);
  sd["base_lrs"] = base_lrs_;
  sd["_last_lr"] = last_lr_;
  save_fields(sd);
  return sd;
}

void LRScheduler::load_state_dict(const SchedulerStateDict& sd) {
  const std::string op = name_ + ".load_state_dict";
  detail::check_class(sd, name_, op);
  const std::size_t n = target_.num_groups();
  // Read everything first: a bad dict changes nothing.
  const auto last_epoch = detail::sd_int(sd, "last_epoch", op);
  const auto step_count = detail::sd_int(sd, "_step_count", op);
  const auto base_lrs = detail::sd_list(sd, "base_lrs", op, n);
  const auto last_lr = detail::sd_list(sd, "_last_lr", op, n);
  load_fields(sd);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = base_lrs;
  last_lr_ = last_lr;
}

// --- SequentialLR --------------------------------------------------------------------

SequentialLR::SequentialLR(ScheduleTarget target, std::vector<std::unique_ptr<LRScheduler>> schedulers,
                           std::vector<std::int64_t> milestones)
    : LRScheduler("SequentialLR", std::move(target)), schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  if (schedulers_.empty()) throw ValueError(name(), "expects at least one scheduler");
  for (std::size_t i = 0; i < schedulers_.size(); ++i) {
    if (!schedulers_[i]) throw ValueError(name(), "scheduler " + std::to_string(i) + " is null");
    if (schedulers_[i]->target().identity() != target_.identity())
      throw ValueError(name(), "Sequential Schedulers expects all schedulers to belong to the same optimizer, but "
                               "got schedulers at index " + std::to_string(i) +
                                   " to be different than the optimizer passed in.");
  }
  if (milestones_.size() != schedulers_.size() - 1)
    throw ValueError(name(), "Sequential Schedulers expects number of schedulers provided to be one more than the "
                             "number of milestone points, but got number of schedulers " +
                                 std::to_string(schedulers_.size()) + " and the number of milestones to be equal to " +
                                 std::to_string(milestones_.size()));
  for (auto& s : schedulers_) s->defer_commit_ = true;
  last_epoch_ = 0;
  // torch: every group's lr back to its initial_lr, every child one epoch
  // back, and the first child's initial step again.
  for (std::size_t g = 0; g < target_.num_groups(); ++g) {
    const std::optional<double>& initial = target_.initial_lr(g);
    if (!initial)
      throw KeyError(name(), "param 'initial_lr' is not specified in param_groups[" + std::to_string(g) +
                                 "] (build the schedulers on the optimizer first)");
    target_.set_lr(g, *initial);
    base_lrs_.push_back(*initial);
  }
  for (auto& s : schedulers_) s->set_last_epoch(s->last_epoch() - 1);
  schedulers_[0]->initial_step();
  last_lr_ = schedulers_[0]->get_last_lr();
  target_.commit();
}

void SequentialLR::step() {
  ++last_epoch_;
  const auto idx = static_cast<std::size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  LRScheduler& s = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_) s.step_to(0);
  else s.step();
  last_lr_ = s.get_last_lr();
  if (!defer_commit_) target_.commit();
}

SchedulerStateDict SequentialLR::state_dict() const {
  SchedulerStateDict sd;
  sd["_class"] = name();
  sd["last_epoch"] = static_cast<double>(last_epoch_);
  sd["_last_lr"] = last_lr_;
  sd["_milestones"] = detail::to_doubles(milestones_);
  detail::put_children(sd, schedulers_);
  return sd;
}

void SequentialLR::load_state_dict(const SchedulerStateDict& sd) {
  const std::string op = name() + ".load_state_dict";
  detail::check_class(sd, name(), op);
  const auto last_epoch = detail::sd_int(sd, "last_epoch", op);
  const auto last_lr = detail::sd_list(sd, "_last_lr", op, target_.num_groups());
  const auto milestones = detail::sd_ints(sd, "_milestones", op);
  if (milestones.size() != milestones_.size())
    throw StateDictError(op, "the dict has " + std::to_string(milestones.size()) + " milestones, this scheduler " +
                                 std::to_string(milestones_.size()));
  detail::load_children(sd, schedulers_, op);
  last_epoch_ = last_epoch;
  last_lr_ = last_lr;
  milestones_ = milestones;
}

// --- ChainedScheduler ---------------------------------------------------------------

namespace {
ScheduleTarget first_target(const std::vector<std::unique_ptr<LRScheduler>>& s) {
  if (s.empty() || !s[0]) throw ValueError("ChainedScheduler", "expects at least one scheduler");
  return s[0]->target();
}
}  // namespace

ChainedScheduler::ChainedScheduler(std::vector<std::unique_ptr<LRScheduler>> schedulers)
    : LRScheduler("ChainedScheduler", first_target(schedulers)), schedulers_(std::move(schedulers)) {
  for (std::size_t i = 1; i < schedulers_.size(); ++i) {
    if (!schedulers_[i]) throw ValueError(name(), "scheduler " + std::to_string(i) + " is null");
    if (schedulers_[i]->target().identity() != target_.identity())
      throw ValueError(name(), "ChainedScheduler expects all schedulers to belong to the same optimizer, but got "
                               "schedulers at index 0 and " + std::to_string(i) + " to be different");
  }
  for (auto& s : schedulers_) s->defer_commit_ = true;
  // torch's ChainedScheduler takes no initial step.
  last_lr_ = group_lrs();
  base_lrs_ = schedulers_[0]->base_lrs();
  last_epoch_ = 0;
}

void ChainedScheduler::step() {
  for (auto& s : schedulers_) s->step();
  last_lr_ = group_lrs();
  if (!defer_commit_) target_.commit();
}

SchedulerStateDict ChainedScheduler::state_dict() const {
  SchedulerStateDict sd;
  sd["_class"] = name();
  sd["_last_lr"] = last_lr_;
  detail::put_children(sd, schedulers_);
  return sd;
}

void ChainedScheduler::load_state_dict(const SchedulerStateDict& sd) {
  const std::string op = name() + ".load_state_dict";
  detail::check_class(sd, name(), op);
  const auto last_lr = detail::sd_list(sd, "_last_lr", op, target_.num_groups());
  detail::load_children(sd, schedulers_, op);
  last_lr_ = last_lr;
}

}  // namespace dopt::optim
