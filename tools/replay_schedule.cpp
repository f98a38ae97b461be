// The learning-rate scheduler of a conformance case (wrapper.lr_scheduler,
// ../shared/conformance/FORMAT.md): built from its JSON through the public
// scheduler classes, stepped after every optimizer step, recorded as sched.*.
#include <nlohmann/json.hpp>

#include "dopt/optim/lr_scheduler.hpp"
#include "replay_case.hpp"

namespace dopt::replay {
namespace {

using json = nlohmann::json;
constexpr const char* kOp = "replay lr_scheduler";

[[noreturn]] void unsupported(const std::string& what) { throw UnsupportedCase(kOp, what); }

const json& arg(const json& args, const char* key, const std::string& cls) {
  auto it = args.find(key);
  if (it == args.end()) unsupported(cls + " without argument '" + key + "'");
  return *it;
}
double num(const json& args, const char* key, const std::string& cls) {
  const json& v = arg(args, key, cls);
  if (!v.is_number()) unsupported(cls + "." + key + " must be a number, got " + v.dump());
  return v.get<double>();
}
std::int64_t integer(const json& args, const char* key, const std::string& cls) {
  const json& v = arg(args, key, cls);
  if (!v.is_number_integer()) unsupported(cls + "." + key + " must be an integer, got " + v.dump());
  return v.get<std::int64_t>();
}
std::optional<std::int64_t> opt_integer(const json& args, const char* key, const std::string& cls) {
  if (arg(args, key, cls).is_null()) return std::nullopt;
  return integer(args, key, cls);
}
bool flag(const json& args, const char* key, const std::string& cls) {
  const json& v = arg(args, key, cls);
  if (!v.is_boolean()) unsupported(cls + "." + key + " must be true or false");
  return v.get<bool>();
}
std::string str(const json& args, const char* key, const std::string& cls) {
  const json& v = arg(args, key, cls);
  if (!v.is_string()) unsupported(cls + "." + key + " must be a string");
  return v.get<std::string>();
}
/// One float, or one per group.
std::vector<double> per_group(const json& args, const char* key, const std::string& cls) {
  const json& v = arg(args, key, cls);
  if (v.is_number()) return {v.get<double>()};
  if (!v.is_array()) unsupported(cls + "." + key + " must be a number or a list");
  std::vector<double> out;
  for (const auto& e : v) {
    if (!e.is_number()) unsupported(cls + "." + key + " must hold numbers");
    out.push_back(e.get<double>());
  }
  return out;
}
std::vector<std::int64_t> ints(const json& args, const char* key, const std::string& cls) {
  const json& v = arg(args, key, cls);
  if (!v.is_array()) unsupported(cls + "." + key + " must be a list");
  std::vector<std::int64_t> out;
  for (const auto& e : v) {
    if (!e.is_number_integer()) unsupported(cls + "." + key + " must hold integers");
    out.push_back(e.get<std::int64_t>());
  }
  return out;
}
void only_keys(const json& args, std::initializer_list<const char*> keys, const std::string& cls) {
  for (auto it = args.begin(); it != args.end(); ++it) {
    bool ok = false;
    for (const char* k : keys) ok = ok || it.key() == k;
    if (!ok) unsupported(cls + " argument '" + it.key() + "' is not supported");
  }
}

/// What the case records besides lr: whether some (nested) CyclicLR /
/// OneCycleLR cycles the momentum.
bool cycles_momentum(const json& spec) {
  const std::string cls = spec.at("class").get<std::string>();
  const json& args = spec.at("args");
  if ((cls == "CyclicLR" || cls == "OneCycleLR") && args.value("cycle_momentum", true)) return true;
  if (cls == "SequentialLR" || cls == "ChainedScheduler")
    for (const auto& child : args.at("schedulers"))
      if (cycles_momentum(child)) return true;
  return false;
}

std::unique_ptr<optim::LRScheduler> build(const json& spec, optim::ScheduleTarget target);

std::vector<std::unique_ptr<optim::LRScheduler>> children(const json& args, const std::string& cls,
                                                          const optim::ScheduleTarget& target) {
  const json& list = arg(args, "schedulers", cls);
  if (!list.is_array()) unsupported(cls + ".schedulers must be a list");
  std::vector<std::unique_ptr<optim::LRScheduler>> out;
  for (const auto& child : list) out.push_back(build(child, target));
  return out;
}

std::unique_ptr<optim::LRScheduler> build(const json& spec, optim::ScheduleTarget target) {
  using namespace optim;
  if (!spec.is_object() || !spec.contains("class") || !spec.at("class").is_string() || !spec.contains("args") ||
      !spec.at("args").is_object())
    unsupported("a scheduler must be {\"class\": ..., \"args\": {...}}, got " + spec.dump());
  const std::string cls = spec.at("class").get<std::string>();
  const json& a = spec.at("args");
  if (cls == "StepLR") {
    only_keys(a, {"step_size", "gamma"}, cls);
    return std::make_unique<StepLR>(target, integer(a, "step_size", cls), num(a, "gamma", cls));
  }
  if (cls == "MultiStepLR") {
    only_keys(a, {"milestones", "gamma"}, cls);
    return std::make_unique<MultiStepLR>(target, ints(a, "milestones", cls), num(a, "gamma", cls));
  }
  if (cls == "ExponentialLR") {
    only_keys(a, {"gamma"}, cls);
    return std::make_unique<ExponentialLR>(target, num(a, "gamma", cls));
  }
  if (cls == "CosineAnnealingLR") {
    only_keys(a, {"T_max", "eta_min"}, cls);
    return std::make_unique<CosineAnnealingLR>(target, integer(a, "T_max", cls), num(a, "eta_min", cls));
  }
  if (cls == "LinearLR") {
    only_keys(a, {"start_factor", "end_factor", "total_iters"}, cls);
    return std::make_unique<LinearLR>(target, num(a, "start_factor", cls), num(a, "end_factor", cls),
                                      integer(a, "total_iters", cls));
  }
  if (cls == "ConstantLR") {
    only_keys(a, {"factor", "total_iters"}, cls);
    return std::make_unique<ConstantLR>(target, num(a, "factor", cls), integer(a, "total_iters", cls));
  }
  if (cls == "PolynomialLR") {
    only_keys(a, {"total_iters", "power"}, cls);
    return std::make_unique<PolynomialLR>(target, integer(a, "total_iters", cls), num(a, "power", cls));
  }
  if (cls == "CosineAnnealingWarmRestarts") {
    only_keys(a, {"T_0", "T_mult", "eta_min"}, cls);
    return std::make_unique<CosineAnnealingWarmRestarts>(target, integer(a, "T_0", cls), integer(a, "T_mult", cls),
                                                         num(a, "eta_min", cls));
  }
  if (cls == "OneCycleLR") {
    only_keys(a, {"max_lr", "total_steps", "epochs", "steps_per_epoch", "pct_start", "anneal_strategy",
                  "cycle_momentum", "base_momentum", "max_momentum", "div_factor", "final_div_factor", "three_phase"},
              cls);
    OneCycleLROptions o;
    o.max_lr = per_group(a, "max_lr", cls);
    o.total_steps = opt_integer(a, "total_steps", cls);
    o.epochs = opt_integer(a, "epochs", cls);
    o.steps_per_epoch = opt_integer(a, "steps_per_epoch", cls);
    o.pct_start = num(a, "pct_start", cls);
    o.anneal_strategy = str(a, "anneal_strategy", cls);
    o.cycle_momentum = flag(a, "cycle_momentum", cls);
    o.base_momentum = per_group(a, "base_momentum", cls);
    o.max_momentum = per_group(a, "max_momentum", cls);
    o.div_factor = num(a, "div_factor", cls);
    o.final_div_factor = num(a, "final_div_factor", cls);
    o.three_phase = flag(a, "three_phase", cls);
    return std::make_unique<OneCycleLR>(target, o);
  }
  if (cls == "CyclicLR") {
    only_keys(a, {"base_lr", "max_lr", "step_size_up", "step_size_down", "mode", "gamma", "cycle_momentum",
                  "base_momentum", "max_momentum"},
              cls);
    CyclicLROptions o;
    o.base_lr = per_group(a, "base_lr", cls);
    o.max_lr = per_group(a, "max_lr", cls);
    o.step_size_up = num(a, "step_size_up", cls);
    if (!arg(a, "step_size_down", cls).is_null()) o.step_size_down = num(a, "step_size_down", cls);
    o.mode = str(a, "mode", cls);
    o.gamma = num(a, "gamma", cls);
    o.cycle_momentum = flag(a, "cycle_momentum", cls);
    o.base_momentum = per_group(a, "base_momentum", cls);
    o.max_momentum = per_group(a, "max_momentum", cls);
    return std::make_unique<CyclicLR>(target, o);
  }
  if (cls == "SequentialLR") {
    only_keys(a, {"schedulers", "milestones"}, cls);
    auto kids = children(a, cls, target);
    return std::make_unique<SequentialLR>(target, std::move(kids), ints(a, "milestones", cls));
  }
  if (cls == "ChainedScheduler") {
    only_keys(a, {"schedulers"}, cls);
    return std::make_unique<ChainedScheduler>(children(a, cls, target));
  }
  unsupported("scheduler class '" + cls + "' is not supported");
}

}  // namespace

struct CaseScheduler::Impl {
  const Case& c;
  optim::ScheduleTarget target;
  std::unique_ptr<optim::LRScheduler> sched;
  std::unique_ptr<optim::ReduceLROnPlateau> plateau;
  bool momentum = false, beta1 = false;
};

CaseScheduler::CaseScheduler(const Case& c, optim::ScheduleTarget target)
    : impl_(std::make_unique<Impl>(Impl{c, target, nullptr, nullptr})) {
  json spec;
  try {
    spec = json::parse(c.lr_scheduler);
  } catch (const json::exception& e) {
    throw IOError(kOp, std::string("wrapper.lr_scheduler is not valid JSON: ") + e.what());
  }
  if (!spec.is_object() || !spec.contains("class") || !spec.contains("args")) unsupported("bad lr_scheduler");
  const std::string cls = spec.at("class").get<std::string>();
  if (cls == "ReduceLROnPlateau") {
    const json& a = spec.at("args");
    only_keys(a, {"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"}, cls);
    optim::ReduceLROnPlateauOptions o;
    o.mode = str(a, "mode", cls);
    o.factor = num(a, "factor", cls);
    o.patience = integer(a, "patience", cls);
    o.threshold = num(a, "threshold", cls);
    o.threshold_mode = str(a, "threshold_mode", cls);
    o.cooldown = integer(a, "cooldown", cls);
    o.min_lr = per_group(a, "min_lr", cls);
    o.eps = num(a, "eps", cls);
    impl_->plateau = std::make_unique<optim::ReduceLROnPlateau>(target, o);
  } else {
    impl_->sched = build(spec, target);
  }
  if (cycles_momentum(spec)) {
    impl_->momentum = target.has_momentum();
    impl_->beta1 = !impl_->momentum && target.has_betas();
  }
}

CaseScheduler::~CaseScheduler() = default;

void CaseScheduler::step(int t) {
  if (impl_->plateau) {
    const std::string key = "metric." + std::to_string(t);
    auto it = impl_->c.tensors.find(key);
    if (it == impl_->c.tensors.end()) throw IOError(kOp, "ReduceLROnPlateau case without tensor '" + key + "'");
    impl_->plateau->step(it->second.item());
  } else {
    impl_->sched->step();
  }
}

void CaseScheduler::record(const std::string& tag, std::map<std::string, Tensor>& out) {
  optim::ScheduleTarget& t = impl_->target;
  for (std::size_t g = 0; g < t.num_groups(); ++g) {
    const std::string prefix = "sched." + tag + "." + std::to_string(g) + ".";
    out[prefix + "lr"] = Tensor::scalar(t.lr(g), DType::float64);
    if (impl_->momentum) out[prefix + "momentum"] = Tensor::scalar(t.momentum(g), DType::float64);
    if (impl_->beta1) out[prefix + "beta1"] = Tensor::scalar(t.beta1(g), DType::float64);
  }
}

}  // namespace dopt::replay
