// The single learning-rate schedulers (lr_scheduler.hpp), transcribed from
// torch 1.13's torch/optim/lr_scheduler.py: the same formulas in the same
// order, in double (Python floats), so the values are torch's bit for bit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "dopt/optim/lr_scheduler.hpp"
#include "optim_extra.hpp"
#include "scheduler_util.hpp"

namespace dopt::optim {

using detail::py_float;
constexpr double kPi = std::numbers::pi;  // Python's math.pi

// --- LambdaLR --------------------------------------------------------------------

LambdaLR::LambdaLR(ScheduleTarget target, Lambda lambda) : LambdaLR(target, std::vector<Lambda>(target.num_groups(), lambda)) {}

LambdaLR::LambdaLR(ScheduleTarget target, std::vector<Lambda> lambdas)
    : LRScheduler("LambdaLR", std::move(target)), lambdas_(std::move(lambdas)) {
  if (lambdas_.size() != target_.num_groups())
    throw ValueError(name(), "Expected " + std::to_string(target_.num_groups()) + " lr_lambdas, but got " +
                                 std::to_string(lambdas_.size()));
  for (const auto& l : lambdas_)
    if (!l) throw ValueError(name(), "a lr_lambda is empty");
  start();
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> out;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) out.push_back(base_lrs_[g] * lambdas_[g](last_epoch_));
  return out;
}

// --- StepLR ------------------------------------------------------------------------

StepLR::StepLR(ScheduleTarget target, std::int64_t step_size, double gamma)
    : LRScheduler("StepLR", std::move(target)), step_size_(step_size), gamma_(gamma) {
  if (step_size_ < 1) throw ValueError(name(), "step_size must be >= 1, got " + std::to_string(step_size_));
  start();
}

std::vector<double> StepLR::get_lr() {
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return group_lrs();
  return scaled(group_lrs(), gamma_);
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  const double k = static_cast<double>(detail::py_floordiv(last_epoch_, step_size_));
  return scaled(base_lrs_, std::pow(gamma_, k));
}

std::vector<SchedulerField> StepLR::state_fields() { return {{"step_size", &step_size_}, {"gamma", &gamma_}}; }

// --- MultiStepLR ---------------------------------------------------------------------

MultiStepLR::MultiStepLR(ScheduleTarget target, std::vector<std::int64_t> milestones, double gamma)
    : LRScheduler("MultiStepLR", std::move(target)), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());  // torch keeps a Counter: the order does not matter
  start();
}

std::vector<double> MultiStepLR::get_lr() {
  const auto count = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  if (count == 0) return group_lrs();
  return scaled(group_lrs(), std::pow(gamma_, static_cast<double>(count)));
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  const auto k = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  return scaled(base_lrs_, std::pow(gamma_, static_cast<double>(k)));
}

std::vector<SchedulerField> MultiStepLR::state_fields() { return {{"milestones", &milestones_}, {"gamma", &gamma_}}; }
void MultiStepLR::load_fields(const SchedulerStateDict& sd) {
  LRScheduler::load_fields(sd);
  std::sort(milestones_.begin(), milestones_.end());
}

// --- ConstantLR ------------------------------------------------------------------------

ConstantLR::ConstantLR(ScheduleTarget target, double factor, std::int64_t total_iters)
    : LRScheduler("ConstantLR", std::move(target)), factor_(factor), total_iters_(total_iters) {
  if (factor_ > 1.0 || factor_ < 0)
    throw ValueError(name(), "Constant multiplicative factor expected to be between 0 and 1.");
  start();
}

std::vector<double> ConstantLR::get_lr() {
  if (last_epoch_ == 0) return scaled(group_lrs(), factor_);
  if (last_epoch_ > total_iters_ || last_epoch_ != total_iters_) return group_lrs();
  return scaled(group_lrs(), 1.0 / factor_);
}

std::optional<std::vector<double>> ConstantLR::closed_form_lr() const {
  const double add = last_epoch_ >= total_iters_ ? (1 - factor_) : 0.0;
  return scaled(base_lrs_, factor_ + add);
}

std::vector<SchedulerField> ConstantLR::state_fields() {
  return {{"factor", &factor_}, {"total_iters", &total_iters_}};
}

// --- LinearLR ----------------------------------------------------------------------------

LinearLR::LinearLR(ScheduleTarget target, double start_factor, double end_factor, std::int64_t total_iters)
    : LRScheduler("LinearLR", std::move(target)), start_factor_(start_factor), end_factor_(end_factor),
      total_iters_(total_iters) {
  if (start_factor_ > 1.0 || start_factor_ < 0)
    throw ValueError(name(), "Starting multiplicative factor expected to be between 0 and 1.");
  if (end_factor_ > 1.0 || end_factor_ < 0)
    throw ValueError(name(), "Ending multiplicative factor expected to be between 0 and 1.");
  start();
}

std::vector<double> LinearLR::get_lr() {
  if (last_epoch_ == 0) return scaled(group_lrs(), start_factor_);
  if (last_epoch_ > total_iters_) return group_lrs();
  const double d = end_factor_ - start_factor_;
  const double f = 1. + d / (static_cast<double>(total_iters_) * start_factor_ + static_cast<double>(last_epoch_ - 1) * d);
  return scaled(group_lrs(), f);
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  const double m = static_cast<double>(std::min(total_iters_, last_epoch_));
  return scaled(base_lrs_, start_factor_ + (end_factor_ - start_factor_) * m / static_cast<double>(total_iters_));
}

std::vector<SchedulerField> LinearLR::state_fields() {
  return {{"start_factor", &start_factor_}, {"end_factor", &end_factor_}, {"total_iters", &total_iters_}};
}

// --- ExponentialLR -------------------------------------------------------------------------

ExponentialLR::ExponentialLR(ScheduleTarget target, double gamma)
    : LRScheduler("ExponentialLR", std::move(target)), gamma_(gamma) {
  start();
}

std::vector<double> ExponentialLR::get_lr() {
  if (last_epoch_ == 0) return group_lrs();
  return scaled(group_lrs(), gamma_);
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  return scaled(base_lrs_, std::pow(gamma_, static_cast<double>(last_epoch_)));
}

std::vector<SchedulerField> ExponentialLR::state_fields() { return {{"gamma", &gamma_}}; }

// --- PolynomialLR ------------------------------------------------------------------------------

PolynomialLR::PolynomialLR(ScheduleTarget target, std::int64_t total_iters, double power)
    : LRScheduler("PolynomialLR", std::move(target)), total_iters_(total_iters), power_(power) {
  if (total_iters_ < 1) throw ValueError(name(), "total_iters must be >= 1, got " + std::to_string(total_iters_));
  start();
}

std::vector<double> PolynomialLR::get_lr() {
  if (last_epoch_ == 0 || last_epoch_ > total_iters_) return group_lrs();
  const double T = static_cast<double>(total_iters_);
  const double decay = std::pow((1.0 - static_cast<double>(last_epoch_) / T) /
                                    (1.0 - static_cast<double>(last_epoch_ - 1) / T),
                                power_);
  return scaled(group_lrs(), decay);
}

std::optional<std::vector<double>> PolynomialLR::closed_form_lr() const {
  const double m = static_cast<double>(std::min(total_iters_, last_epoch_));
  return scaled(base_lrs_, std::pow(1.0 - m / static_cast<double>(total_iters_), power_));
}

std::vector<SchedulerField> PolynomialLR::state_fields() {
  return {{"total_iters", &total_iters_}, {"power", &power_}};
}

// --- CosineAnnealingLR ---------------------------------------------------------------------------

CosineAnnealingLR::CosineAnnealingLR(ScheduleTarget target, std::int64_t T_max, double eta_min)
    : LRScheduler("CosineAnnealingLR", std::move(target)), T_max_(T_max), eta_min_(eta_min) {
  if (T_max_ < 1) throw ValueError(name(), "T_max must be >= 1, got " + std::to_string(T_max_));
  start();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  std::vector<double> out = group_lrs();
  const double e = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  if (last_epoch_ == 0) return out;
  if (step_count_ == 1 && last_epoch_ > 0) {
    for (std::size_t g = 0; g < out.size(); ++g)
      out[g] = eta_min_ + (base_lrs_[g] - eta_min_) * (1 + std::cos(e * kPi / T)) / 2;
    return out;
  }
  if ((last_epoch_ - 1 - T_max_) % (2 * T_max_) == 0) {  // Python's % is 0 exactly when C++'s is
    for (std::size_t g = 0; g < out.size(); ++g)
      out[g] = out[g] + (base_lrs_[g] - eta_min_) * (1 - std::cos(kPi / T)) / 2;
    return out;
  }
  for (auto& lr : out)
    lr = (1 + std::cos(kPi * e / T)) / (1 + std::cos(kPi * (e - 1) / T)) * (lr - eta_min_) + eta_min_;
  return out;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  std::vector<double> out;
  const double e = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  for (double b : base_lrs_) out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(kPi * e / T)) / 2);
  return out;
}

std::vector<SchedulerField> CosineAnnealingLR::state_fields() { return {{"T_max", &T_max_}, {"eta_min", &eta_min_}}; }

// --- CosineAnnealingWarmRestarts -------------------------------------------------------------------

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(ScheduleTarget target, std::int64_t T_0,
                                                         std::int64_t T_mult, double eta_min)
    : LRScheduler("CosineAnnealingWarmRestarts", std::move(target)), T_0_(T_0), T_mult_(T_mult),
      T_i_(static_cast<double>(T_0)), T_cur_(-1), eta_min_(eta_min) {
  if (T_0_ <= 0) throw ValueError(name(), "Expected positive integer T_0, but got " + std::to_string(T_0_));
  if (T_mult_ < 1) throw ValueError(name(), "Expected integer T_mult >= 1, but got " + std::to_string(T_mult_));
  start();
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(kPi * T_cur_ / T_i_)) / 2);
  return out;
}

void CosineAnnealingWarmRestarts::step() {
  if (last_epoch_ < 0) {
    step_epoch(0.0);
    return;
  }
  T_cur_ = T_cur_ + 1;
  if (T_cur_ >= T_i_) {
    T_cur_ = T_cur_ - T_i_;
    T_i_ = T_i_ * static_cast<double>(T_mult_);
  }
  last_epoch_ = last_epoch_ + 1;
  apply(get_lr());
}

void CosineAnnealingWarmRestarts::step_epoch(double epoch) {
  if (!(epoch >= 0)) throw ValueError(name(), "Expected non-negative epoch, but got " + py_float(epoch));
  const double T0 = static_cast<double>(T_0_);
  if (epoch >= T0) {
    if (T_mult_ == 1) {
      T_cur_ = std::fmod(epoch, T0);  // Python's % for non-negative operands
    } else {
      const double m = static_cast<double>(T_mult_);
      const auto n = static_cast<std::int64_t>(std::log(epoch / T0 * (m - 1) + 1) / std::log(m));
      const double mn = std::pow(m, static_cast<double>(n));
      T_cur_ = epoch - T0 * (mn - 1) / (m - 1);
      T_i_ = T0 * mn;
    }
  } else {
    T_i_ = T0;
    T_cur_ = epoch;
  }
  last_epoch_ = static_cast<std::int64_t>(std::floor(epoch));
  apply(get_lr());
}

std::vector<SchedulerField> CosineAnnealingWarmRestarts::state_fields() {
  return {{"T_0", &T_0_}, {"T_i", &T_i_}, {"T_mult", &T_mult_}, {"eta_min", &eta_min_}, {"T_cur", &T_cur_}};
}

// --- CyclicLR -------------------------------------------------------------------------------------

CyclicLR::CyclicLR(ScheduleTarget target, CyclicLROptions o)
    : LRScheduler("CyclicLR", std::move(target)), gamma_(o.gamma), mode_(o.mode), cycle_momentum_(o.cycle_momentum) {
  const std::vector<double> base_lrs = per_group(o.base_lr, "base_lr");
  for (std::size_t g = 0; g < base_lrs.size(); ++g) target_.set_lr(g, base_lrs[g]);
  max_lrs_ = per_group(o.max_lr, "max_lr");
  const double up = o.step_size_up;
  const double down = o.step_size_down ? *o.step_size_down : up;
  total_size_ = up + down;
  step_ratio_ = up / total_size_;
  if (mode_ == "triangular" || mode_ == "triangular2") scale_mode_ = "cycle";
  else if (mode_ == "exp_range") scale_mode_ = "iterations";
  else throw ValueError(name(), "mode is invalid and scale_fn is None (mode '" + mode_ + "')");
  if (cycle_momentum_) {
    if (!target_.has_momentum() && !target_.has_betas())
      throw ValueError(name(), "optimizer must support momentum with `cycle_momentum` option enabled");
    use_beta1_ = !target_.has_momentum();
    const std::vector<double> base_m = per_group(o.base_momentum, "base_momentum");
    for (std::size_t g = 0; g < base_m.size(); ++g) {
      if (use_beta1_) target_.set_beta1(g, base_m[g]);
      else target_.set_momentum(g, base_m[g]);
    }
    for (std::size_t g = 0; g < base_m.size(); ++g)
      base_momentums_.push_back(use_beta1_ ? target_.beta1(g) : target_.momentum(g));
    max_momentums_ = per_group(o.max_momentum, "max_momentum");
  }
  start();
  base_lrs_ = base_lrs;  // torch: set after the initial step
}

double CyclicLR::scale_fn(double x) const {
  if (mode_ == "triangular") return 1.;
  if (mode_ == "triangular2") return 1 / std::pow(2., x - 1);
  return std::pow(gamma_, x);
}

std::vector<double> CyclicLR::get_lr() {
  const double e = static_cast<double>(last_epoch_);
  const double cycle = std::floor(1 + e / total_size_);
  const double x = 1. + e / total_size_ - cycle;
  const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  const double s = scale_fn(scale_mode_ == "cycle" ? cycle : e);
  std::vector<double> lrs;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    const double base_height = (max_lrs_[g] - base_lrs_[g]) * scale_factor;
    lrs.push_back(base_lrs_[g] + base_height * s);
  }
  if (cycle_momentum_) {
    for (std::size_t g = 0; g < base_momentums_.size(); ++g) {
      const double base_height = (max_momentums_[g] - base_momentums_[g]) * scale_factor;
      const double m = max_momentums_[g] - base_height * s;
      if (use_beta1_) target_.set_beta1(g, m);
      else target_.set_momentum(g, m);
    }
  }
  return lrs;
}

void CyclicLR::save_fields(SchedulerStateDict& sd) const {
  sd["max_lrs"] = max_lrs_;
  sd["total_size"] = total_size_;
  sd["step_ratio"] = step_ratio_;
  sd["mode"] = mode_;
  sd["gamma"] = gamma_;
  sd["scale_mode"] = scale_mode_;
  sd["cycle_momentum"] = cycle_momentum_;
  sd["use_beta1"] = use_beta1_;
  if (cycle_momentum_) {
    sd["base_momentums"] = base_momentums_;
    sd["max_momentums"] = max_momentums_;
  }
}
void CyclicLR::load_fields(const SchedulerStateDict& sd) {
  const std::string op = name() + ".load_state_dict";
  const std::size_t n = target_.num_groups();
  auto max_lrs = detail::sd_list(sd, "max_lrs", op, n);
  const double total = detail::sd_number(sd, "total_size", op), ratio = detail::sd_number(sd, "step_ratio", op);
  const std::string mode = detail::sd_string(sd, "mode", op), scale_mode = detail::sd_string(sd, "scale_mode", op);
  if (mode != "triangular" && mode != "triangular2" && mode != "exp_range")
    throw StateDictError(op, "unknown mode '" + mode + "'");
  const double gamma = detail::sd_number(sd, "gamma", op);
  const bool cm = detail::sd_flag(sd, "cycle_momentum", op), beta1 = detail::sd_flag(sd, "use_beta1", op);
  std::vector<double> bm, mm;
  if (cm) {
    bm = detail::sd_list(sd, "base_momentums", op, n);
    mm = detail::sd_list(sd, "max_momentums", op, n);
  }
  max_lrs_ = std::move(max_lrs);
  total_size_ = total;
  step_ratio_ = ratio;
  mode_ = mode;
  scale_mode_ = scale_mode;
  gamma_ = gamma;
  cycle_momentum_ = cm;
  use_beta1_ = beta1;
  base_momentums_ = std::move(bm);
  max_momentums_ = std::move(mm);
}

// --- OneCycleLR ------------------------------------------------------------------------------------

OneCycleLR::OneCycleLR(ScheduleTarget target, OneCycleLROptions o)
    : LRScheduler("OneCycleLR", std::move(target)), cos_(o.anneal_strategy == "cos"),
      cycle_momentum_(o.cycle_momentum), three_phase_(o.three_phase) {
  if (!o.total_steps && !o.epochs && !o.steps_per_epoch)
    throw ValueError(name(), "You must define either total_steps OR (epochs AND steps_per_epoch)");
  if (o.total_steps) {
    if (*o.total_steps <= 0)
      throw ValueError(name(), "Expected positive integer total_steps, but got " + std::to_string(*o.total_steps));
    total_steps_ = *o.total_steps;
  } else {
    if (!o.epochs || *o.epochs <= 0)
      throw ValueError(name(), "Expected positive integer epochs, but got " +
                                   (o.epochs ? std::to_string(*o.epochs) : std::string("None")));
    if (!o.steps_per_epoch || *o.steps_per_epoch <= 0)
      throw ValueError(name(), "Expected positive integer steps_per_epoch, but got " +
                                   (o.steps_per_epoch ? std::to_string(*o.steps_per_epoch) : std::string("None")));
    total_steps_ = *o.epochs * *o.steps_per_epoch;
  }
  const double T = static_cast<double>(total_steps_);
  enum { kInitial = 0, kMax = 1, kMin = 2, kMaxM = 3, kBaseM = 4 };
  if (three_phase_) {
    phases_ = {{o.pct_start * T - 1, kInitial, kMax, kMaxM, kBaseM},
               {2 * o.pct_start * T - 2, kMax, kInitial, kBaseM, kMaxM},
               {T - 1, kInitial, kMin, kMaxM, kMaxM}};
  } else {
    phases_ = {{o.pct_start * T - 1, kInitial, kMax, kMaxM, kBaseM}, {T - 1, kMax, kMin, kBaseM, kMaxM}};
  }
  if (o.pct_start < 0 || o.pct_start > 1)
    throw ValueError(name(), "Expected float between 0 and 1 pct_start, but got " + py_float(o.pct_start));
  if (o.anneal_strategy != "cos" && o.anneal_strategy != "linear")
    throw ValueError(name(), "anneal_strategy must by one of 'cos' or 'linear', instead got " + o.anneal_strategy);
  const std::vector<double> max_lrs = per_group(o.max_lr, "max_lr");
  values_.assign(max_lrs.size(), {});
  for (std::size_t g = 0; g < max_lrs.size(); ++g) {
    values_[g][kInitial] = max_lrs[g] / o.div_factor;
    values_[g][kMax] = max_lrs[g];
    values_[g][kMin] = values_[g][kInitial] / o.final_div_factor;
  }
  if (cycle_momentum_) {
    if (!target_.has_momentum() && !target_.has_betas())
      throw ValueError(name(), "optimizer must support momentum with `cycle_momentum` option enabled");
    use_beta1_ = target_.has_betas();
    const std::vector<double> max_m = per_group(o.max_momentum, "max_momentum");
    const std::vector<double> base_m = per_group(o.base_momentum, "base_momentum");
    for (std::size_t g = 0; g < max_m.size(); ++g) {
      if (use_beta1_) target_.set_beta1(g, max_m[g]);
      else target_.set_momentum(g, max_m[g]);
      values_[g][kMaxM] = max_m[g];
      values_[g][kBaseM] = base_m[g];
    }
  }
  for (std::size_t g = 0; g < values_.size(); ++g) target_.initial_lr(g) = values_[g][kInitial];
  start();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (cos_) {
    const double cos_out = std::cos(kPi * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

std::vector<double> OneCycleLR::get_lr() {
  const std::int64_t step_num = last_epoch_;
  if (step_num > total_steps_)
    throw ValueError(name(), "Tried to step " + std::to_string(step_num + 1) +
                                 " times. The specified number of total steps is " + std::to_string(total_steps_));
  const double s = static_cast<double>(step_num);
  std::vector<double> lrs;
  for (std::size_t g = 0; g < values_.size(); ++g) {
    double start_step = 0, lr = 0, m = 0;
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const Phase& ph = phases_[i];
      if (s <= ph.end_step || i == phases_.size() - 1) {
        const double pct = (s - start_step) / (ph.end_step - start_step);
        lr = anneal(values_[g][static_cast<std::size_t>(ph.start_lr)], values_[g][static_cast<std::size_t>(ph.end_lr)], pct);
        if (cycle_momentum_)
          m = anneal(values_[g][static_cast<std::size_t>(ph.start_momentum)],
                     values_[g][static_cast<std::size_t>(ph.end_momentum)], pct);
        break;
      }
      start_step = ph.end_step;
    }
    lrs.push_back(lr);
    if (cycle_momentum_) {
      if (use_beta1_) target_.set_beta1(g, m);
      else target_.set_momentum(g, m);
    }
  }
  return lrs;
}

void OneCycleLR::save_fields(SchedulerStateDict& sd) const {
  sd["total_steps"] = static_cast<double>(total_steps_);
  sd["anneal_strategy"] = std::string(cos_ ? "cos" : "linear");
  sd["cycle_momentum"] = cycle_momentum_;
  sd["use_beta1"] = use_beta1_;
  sd["three_phase"] = three_phase_;
  std::vector<double> ends;
  for (const auto& p : phases_) ends.push_back(p.end_step);
  sd["phase_end_steps"] = ends;
  const char* names[5] = {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"};
  for (std::size_t k = 0; k < 5; ++k) {
    std::vector<double> v;
    for (const auto& g : values_) v.push_back(g[k]);
    sd[std::string("group_") + names[k]] = v;
  }
}
void OneCycleLR::load_fields(const SchedulerStateDict& sd) {
  const std::string op = name() + ".load_state_dict";
  const auto total = detail::sd_int(sd, "total_steps", op);
  const std::string strategy = detail::sd_string(sd, "anneal_strategy", op);
  if (strategy != "cos" && strategy != "linear") throw StateDictError(op, "unknown anneal_strategy '" + strategy + "'");
  const bool cm = detail::sd_flag(sd, "cycle_momentum", op), beta1 = detail::sd_flag(sd, "use_beta1", op);
  const bool three = detail::sd_flag(sd, "three_phase", op);
  const auto ends = detail::sd_list(sd, "phase_end_steps", op, three ? 3 : 2);
  const char* names[5] = {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"};
  std::vector<std::array<double, 5>> values(target_.num_groups());
  for (std::size_t k = 0; k < 5; ++k) {
    const auto v = detail::sd_list(sd, (std::string("group_") + names[k]).c_str(), op, values.size());
    for (std::size_t g = 0; g < values.size(); ++g) values[g][k] = v[g];
  }
  total_steps_ = total;
  cos_ = strategy == "cos";
  cycle_momentum_ = cm;
  use_beta1_ = beta1;
  if (three != three_phase_) {
    three_phase_ = three;
    enum { kInitial = 0, kMax = 1, kMin = 2, kMaxM = 3, kBaseM = 4 };
    if (three) phases_ = {{0, kInitial, kMax, kMaxM, kBaseM}, {0, kMax, kInitial, kBaseM, kMaxM}, {0, kInitial, kMin, kMaxM, kMaxM}};
    else phases_ = {{0, kInitial, kMax, kMaxM, kBaseM}, {0, kMax, kMin, kBaseM, kMaxM}};
  }
  for (std::size_t i = 0; i < phases_.size(); ++i) phases_[i].end_step = ends[i];
  values_ = std::move(values);
}

// --- ReduceLROnPlateau ---------------------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(ScheduleTarget target, ReduceLROnPlateauOptions options)
    : target_(std::move(target)), o_(std::move(options)) {
  const char* op = "ReduceLROnPlateau";
  if (o_.factor >= 1.0) throw ValueError(op, "Factor should be < 1.0.");
  const std::size_t n = target_.num_groups();
  if (o_.min_lr.size() == 1) min_lrs_.assign(n, o_.min_lr[0]);
  else if (o_.min_lr.size() == n) min_lrs_ = o_.min_lr;
  else throw ValueError(op, "expected " + std::to_string(n) + " min_lrs, got " + std::to_string(o_.min_lr.size()));
  if (o_.mode != "min" && o_.mode != "max") throw ValueError(op, "mode " + o_.mode + " is unknown!");
  if (o_.threshold_mode != "rel" && o_.threshold_mode != "abs")
    throw ValueError(op, "threshold mode " + o_.threshold_mode + " is unknown!");
  mode_worse_ = o_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  best_ = mode_worse_;
  for (std::size_t g = 0; g < n; ++g) last_lr_.push_back(target_.lr(g));
}

bool ReduceLROnPlateau::is_better(double a, double best) const {
  if (o_.mode == "min" && o_.threshold_mode == "rel") return a < best * (1. - o_.threshold);
  if (o_.mode == "min") return a < best - o_.threshold;
  if (o_.threshold_mode == "rel") return a > best * (o_.threshold + 1.);
  return a > best + o_.threshold;
}

void ReduceLROnPlateau::step(double metric) {
  last_epoch_ = last_epoch_ + 1;
  if (is_better(metric, best_)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    num_bad_epochs_ += 1;
  }
  if (cooldown_counter_ > 0) {
    cooldown_counter_ -= 1;
    num_bad_epochs_ = 0;  // bad epochs in cooldown do not count
  }
  if (num_bad_epochs_ > o_.patience) {
    for (std::size_t g = 0; g < target_.num_groups(); ++g) {
      const double old_lr = target_.lr(g);
      const double new_lr = std::max(old_lr * o_.factor, min_lrs_[g]);
      if (old_lr - new_lr > o_.eps) target_.set_lr(g, new_lr);
    }
    target_.commit();
    cooldown_counter_ = o_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_.clear();
  for (std::size_t g = 0; g < target_.num_groups(); ++g) last_lr_.push_back(target_.lr(g));
}

SchedulerStateDict ReduceLROnPlateau::state_dict() const {
  return {{"_class", std::string("ReduceLROnPlateau")},
          {"factor", o_.factor},
          {"min_lrs", min_lrs_},
          {"patience", static_cast<double>(o_.patience)},
          {"cooldown", static_cast<double>(o_.cooldown)},
          {"cooldown_counter", static_cast<double>(cooldown_counter_)},
          {"mode", o_.mode},
          {"threshold", o_.threshold},
          {"threshold_mode", o_.threshold_mode},
          {"best", best_},
          {"num_bad_epochs", static_cast<double>(num_bad_epochs_)},
          {"mode_worse", mode_worse_},
          {"eps", o_.eps},
          {"last_epoch", static_cast<double>(last_epoch_)},
          {"_last_lr", last_lr_}};
}

void ReduceLROnPlateau::load_state_dict(const SchedulerStateDict& sd) {
  const std::string op = "ReduceLROnPlateau.load_state_dict";
  detail::check_class(sd, "ReduceLROnPlateau", op);
  ReduceLROnPlateauOptions o = o_;
  o.factor = detail::sd_number(sd, "factor", op);
  const auto min_lrs = detail::sd_list(sd, "min_lrs", op, target_.num_groups());
  o.patience = detail::sd_int(sd, "patience", op);
  o.cooldown = detail::sd_int(sd, "cooldown", op);
  const auto cooldown_counter = detail::sd_int(sd, "cooldown_counter", op);
  o.mode = detail::sd_string(sd, "mode", op);
  o.threshold = detail::sd_number(sd, "threshold", op);
  o.threshold_mode = detail::sd_string(sd, "threshold_mode", op);
  if (o.mode != "min" && o.mode != "max") throw StateDictError(op, "mode " + o.mode + " is unknown!");
  if (o.threshold_mode != "rel" && o.threshold_mode != "abs")
    throw StateDictError(op, "threshold mode " + o.threshold_mode + " is unknown!");
  const double best = detail::sd_number(sd, "best", op);
  const auto bad = detail::sd_int(sd, "num_bad_epochs", op);
  o.eps = detail::sd_number(sd, "eps", op);
  const auto last_epoch = detail::sd_int(sd, "last_epoch", op);
  const auto last_lr = detail::sd_list(sd, "_last_lr", op, target_.num_groups());
  o_ = o;
  min_lrs_ = min_lrs;
  cooldown_counter_ = cooldown_counter;
  best_ = best;
  num_bad_epochs_ = bad;
  mode_worse_ = o_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  last_epoch_ = last_epoch;
  last_lr_ = last_lr;
}

}  // namespace dopt::optim
