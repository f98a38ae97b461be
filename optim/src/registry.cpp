#include "dopt/optim/registry.hpp"

#include <cctype>
#include <cmath>
#include <map>
#include <mutex>
#include <typeinfo>

#include <nlohmann/json.hpp>

#include "dopt/runtime/internal/json_object.hpp"

namespace dopt::optim {

// --- OptimizerSpec JSON ------------------------------------------------------

std::string OptimizerSpec::to_json() const {
  const char* op = "OptimizerSpec.to_json";
  for (const auto& [k, v] : hyperparameters) {
    bool finite = true;
    if (auto* d = std::get_if<double>(&v)) finite = std::isfinite(*d);
    if (auto* xs = std::get_if<std::vector<double>>(&v))
      for (double x : *xs) finite = finite && std::isfinite(x);
    if (!finite) throw ValueError(op, "hyperparameter '" + k + "' is not finite (JSON has no NaN or infinity)");
  }
  nlohmann::json j = nlohmann::json::object();
  j["name"] = name;
  j["hyperparameters"] = nlohmann::json::parse(hyper_to_json(hyperparameters));
  return j.dump();
}

OptimizerSpec OptimizerSpec::from_json(const std::string& text) {
  const char* op = "OptimizerSpec.from_json";
  const nlohmann::json j = parse_json_object(text, op, "not valid JSON: ", "an optimizer spec must be a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "name" && it.key() != "hyperparameters")
      throw ValueError(op, "unknown key '" + it.key() + "' (known: name, hyperparameters)");
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) throw ValueError(op, "\"name\" must be a string");
  OptimizerSpec spec;
  spec.name = name->get<std::string>();
  auto hp = j.find("hyperparameters");
  if (hp != j.end()) {
    if (!hp->is_object()) throw ValueError(op, "\"hyperparameters\" must be a JSON object");
    spec.hyperparameters = hyper_from_json(hp->dump(), op);
  }
  return spec;
}

// --- registry ------------------------------------------------------------------

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, OptimizerFactories> entries;
};

OptimizerFactories sgd_factories() {
  OptimizerFactories f = optimizer_factories<SGD, FunctionalSGD>();
  // SGDOptions has no default: lr is required, as in torch 1.13.
  f.options = [](const Hyperparams& h) -> std::unique_ptr<OptimizerOptions> {
    if (!h.count("lr"))
      throw ValueError("SGD", "parameter group didn't specify a value of required optimization parameter lr");
    auto o = std::make_unique<SGDOptions>(hyper_number(h, "lr", "SGDOptions"));
    o->set_hyperparams(h);
    return o;
  };
  return f;
}

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: usable from static destructors
    reg->entries.emplace("SGD", sgd_factories());
    reg->entries.emplace("Adam", optimizer_factories<Adam, FunctionalAdam>());
    reg->entries.emplace("AdamW", optimizer_factories<AdamW, FunctionalAdamW>());
    reg->entries.emplace("Adagrad", optimizer_factories<Adagrad, FunctionalAdagrad>());
    reg->entries.emplace("RMSprop", optimizer_factories<RMSprop, FunctionalRMSprop>());
    reg->entries.emplace("Adamax", optimizer_factories<Adamax, FunctionalAdamax>());
    reg->entries.emplace("Adadelta", optimizer_factories<Adadelta, FunctionalAdadelta>());
    reg->entries.emplace("Rprop", optimizer_factories<Rprop, FunctionalRprop>());
    reg->entries.emplace("NAdam", optimizer_factories<NAdam, FunctionalNAdam>());
    reg->entries.emplace("RAdam", optimizer_factories<RAdam, FunctionalRAdam>());
    reg->entries.emplace("Muon", optimizer_factories<Muon, FunctionalMuon>());
    return reg;
  }();
  return *r;
}

std::string known_list(const Registry& r) {
  std::string s;
  for (const auto& [name, f] : r.entries) s += (s.empty() ? "" : ", ") + name;
  return s;
}

// Exact name first, then a case-insensitive match ("adamw" finds "AdamW"),
// so that command-line flags and config files can use lower case.
std::map<std::string, OptimizerFactories>::const_iterator find_entry(const Registry& r, const std::string& name) {
  auto it = r.entries.find(name);
  if (it != r.entries.end()) return it;
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string want = lower(name);
  for (auto e = r.entries.begin(); e != r.entries.end(); ++e)
    if (lower(e->first) == want) return e;
  return r.entries.end();
}

OptimizerFactories lookup(const std::string& name, const char* op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = find_entry(r, name);
  if (it == r.entries.end())
    throw ValueError(op, "unknown optimizer '" + name + "' (known: " + known_list(r) + ")");
  return it->second;
}

std::unique_ptr<OptimizerOptions> options_of(const OptimizerFactories& f, const OptimizerSpec& spec) {
  auto o = f.options(spec.hyperparameters);
  o->validate(spec.name);
  return o;
}

}  // namespace

bool register_optimizer(const std::string& name, OptimizerFactories factories) {
  const char* op = "register_optimizer";
  if (name.empty()) throw ValueError(op, "the optimizer name is empty");
  if (!factories.options || !factories.optimizer)
    throw ValueError(op, "optimizer '" + name + "' needs both an options and an optimizer factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // A name that matches an entry case-insensitively counts as present, so
  // that lookups stay unambiguous.
  if (find_entry(r, name) != r.entries.end()) return false;
  return r.entries.emplace(name, std::move(factories)).second;
}

std::vector<std::string> registered_optimizers() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.entries) names.push_back(name);
  return names;
}

OptimizerSpec spec_of(const OptimizerOptions& options, const char* op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [name, f] : r.entries)
    if (f.options_type && *f.options_type == typeid(options)) return OptimizerSpec{name, options.to_hyperparams()};
  throw TypeError(op, std::string("no registered optimizer takes options of type ") + typeid(options).name() +
                          " (register it with register_optimizer and optimizer_factories)");
}

std::unique_ptr<OptimizerOptions> make_options(const OptimizerSpec& spec) {
  return options_of(lookup(spec.name, "make_options"), spec);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<OptimizerParamGroup> groups) {
  const OptimizerFactories f = lookup(spec.name, "make_optimizer");
  auto defaults = options_of(f, spec);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& o = groups[i].options;
    if (o && typeid(*o) != typeid(*defaults))
      throw TypeError("make_optimizer", "param group " + std::to_string(i) + " has options of another type than " +
                                            spec.name + "'s");
  }
  return f.optimizer(std::move(groups), *defaults);
}

std::unique_ptr<FunctionalOptimizer> make_functional(const OptimizerSpec& spec, std::vector<Tensor> params,
                                                     bool allow_empty_param_list) {
  const OptimizerFactories f = lookup(spec.name, "make_functional");
  if (!f.functional)
    throw ValueError("make_functional", "Optimizer " + spec.name + " does not have a functional counterpart!");
  auto o = options_of(f, spec);
  return f.functional(std::move(params), *o, allow_empty_param_list);
}

std::unique_ptr<FunctionalOptimizer> as_functional_optim(const std::string& name_or_class,
                                                         const Hyperparams& hyperparameters) {
  const char* op = "as_functional_optim";
  std::string name = name_or_class;
  for (const char* prefix : {"_Functional", "Functional"}) {
    const std::string pre(prefix);
    if (name.rfind(pre, 0) == 0 && name.size() > pre.size()) {
      name = name.substr(pre.size());
      break;
    }
  }
  OptimizerFactories f;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = find_entry(r, name);
    if (it != r.entries.end()) f = it->second;
  }
  if (!f.functional) throw ValueError(op, "Optimizer " + name_or_class + " does not have a functional counterpart!");
  auto o = options_of(f, OptimizerSpec{name, hyperparameters});
  return f.functional({}, *o, /*allow_empty_param_list=*/true);
}

}  // namespace dopt::optim
