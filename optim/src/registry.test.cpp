#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dopt/optim/registry.hpp"
#include "optimizer_tests.hpp"

namespace {

// One non-default spec per built-in optimizer.
std::vector<OptimizerSpec> builtin_specs() {
  using V = std::vector<double>;
  return {
      {"SGD", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 1e-4}}},
      {"Adam", {{"lr", 0.30000000000000004}, {"betas", V{0.8, 0.99}}, {"amsgrad", true}}},
      {"AdamW", {{"lr", 0.012345678901234568}, {"weight_decay", 0.1}, {"maximize", true}}},
      {"Adagrad", {{"lr", 0.05}, {"lr_decay", 0.01}, {"initial_accumulator_value", 0.1}}},
      {"RMSprop", {{"lr", 0.01}, {"momentum", 0.5}, {"centered", true}}},
      {"Adamax", {{"lr", 0.01}, {"betas", V{0.5, 0.6}}}},
      {"Adadelta", {{"rho", 0.8}, {"eps", 1e-5}}},
      {"Rprop", {{"etas", V{0.4, 1.3}}, {"step_sizes", V{1e-4, 10.0}}}},
      {"NAdam", {{"lr", 0.01}, {"momentum_decay", 0.01}, {"weight_decay", 0.1}}},
      {"RAdam", {{"lr", 0.01}, {"betas", V{0.8, 0.99}}}},
  };
}

// spec's hyperparameters over the options' full set: what the built optimizer must hold.
Hyperparams merged(const Hyperparams& full, const Hyperparams& given) {
  Hyperparams out = full;
  for (const auto& [k, v] : given) out[k] = v;
  return out;
}

}  // namespace

TEST_CASE("Registry knows the ten torch optimizers", "[optB][registry]") {
  const auto names = registered_optimizers();
  for (const char* n : {"Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "RMSprop", "Rprop", "SGD", "NAdam", "RAdam"})
    CHECK(std::count(names.begin(), names.end(), n) == 1);
  CHECK(std::is_sorted(names.begin(), names.end()));
}

TEST_CASE("Registry round trip: spec -> json -> spec -> optimizer", "[optB][registry]") {
  for (const OptimizerSpec& spec : builtin_specs()) {
    DYNAMIC_SECTION(spec.name) {
      const std::string json = spec.to_json();
      const OptimizerSpec back = OptimizerSpec::from_json(json);
      CHECK(back == spec);  // numbers round-trip exactly
      CHECK(back.to_json() == json);

      Tensor p = tensor_of(values<float>(kRefNumel, 1));
      auto opt = make_optimizer(back, {OptimizerParamGroup({p})});
      REQUIRE(opt);
      CHECK(opt->name() == spec.name);
      const Hyperparams full = opt->defaults().to_hyperparams();
      CHECK(full == merged(full, spec.hyperparameters));
      CHECK(opt->param_groups()[0].options->to_hyperparams() == full);
      CHECK(make_options(back)->to_hyperparams() == full);

      // Its functional form with the same spec steps identically.
      Tensor q = p.clone();
      auto fn = make_functional(back, {q});
      CHECK(fn->name() == "Functional" + spec.name);
      CHECK(fn->optimizer_name() == spec.name);
      CHECK(fn->defaults() == full);
      for (int t = 0; t < 3; ++t) {
        const Tensor g = tensor_of(values<float>(kRefNumel, 50 + t));
        p.set_grad(g);
        opt->step();
        fn->step({g});
      }
      CHECK(p.equal(q));
      CHECK_FALSE(p.equal(tensor_of(values<float>(kRefNumel, 1))));

      // as_functional_optim: no params, used with step_param.
      auto af = as_functional_optim(spec.name, spec.hyperparameters);
      CHECK(af->params().empty());
      CHECK(af->defaults() == full);
    }
  }
}

TEST_CASE("Registry: unknown names", "[optB][registry]") {
  const OptimizerSpec spec{"Lamb", {}};
  Tensor p = Tensor::zeros({3});
  CHECK_THROWS_AS(make_optimizer(spec, {OptimizerParamGroup({p})}), ValueError);
  CHECK_THROWS_WITH(make_optimizer(spec, {OptimizerParamGroup({p})}),
                    Contains("make_optimizer: unknown optimizer 'Lamb' (known: Adadelta, Adagrad, Adam, AdamW"));
  CHECK_THROWS_WITH(make_options(spec), Contains("unknown optimizer 'Lamb'") && Contains("SGD"));
  CHECK_THROWS_WITH(make_functional(spec, {p}), Contains("unknown optimizer 'Lamb'"));
  CHECK_THROWS_AS(as_functional_optim("Lamb"), ValueError);
  CHECK_THROWS_WITH(as_functional_optim("Lamb"),
                    Equals("as_functional_optim: Optimizer Lamb does not have a functional counterpart!"));
  CHECK_THROWS_WITH(as_functional_optim("Functional"), Contains("Optimizer Functional does not have"));
}

TEST_CASE("Registry names: exact first, then case-insensitive", "[optB][registry]") {
  CHECK(as_functional_optim("adamw")->name() == "FunctionalAdamW");
  CHECK(as_functional_optim("ADAM")->name() == "FunctionalAdam");
  Tensor p = Tensor::zeros({3});
  CHECK(make_optimizer({"rmsprop", {}}, {OptimizerParamGroup({p})})->name() == "RMSprop");
  CHECK(make_options({"sgd", {{"lr", 0.5}}})->get_lr() == 0.5);
}

TEST_CASE("as_functional_optim accepts class and functional class names", "[optB][registry]") {
  for (const char* n : {"Adam", "FunctionalAdam", "_FunctionalAdam"}) {
    auto fn = as_functional_optim(n, {{"lr", 0.1}});
    CHECK(fn->name() == "FunctionalAdam");
    CHECK(fn->lr() == 0.1);
  }
  // Each optimizer's class defaults, torch.optim's (Adamax lr 2e-3).
  CHECK(as_functional_optim("Adamax")->lr() == 2e-3);
  CHECK(as_functional_optim("Adadelta")->lr() == 1.0);
  // step_param on a functional optimizer without params.
  auto fn = as_functional_optim("Rprop", {{"lr", 0.05}});
  Tensor p = tensor_of(values<float>(9, 1));
  Tensor q = p.clone();
  const Tensor g = tensor_of(values<float>(9, 2));
  fn->step_param(p, g);
  Rprop cls({q}, RpropOptions(0.05));
  q.set_grad(g);
  cls.step();
  CHECK(p.equal(q));
}

TEST_CASE("Registry: bad hyperparameters name the key", "[optB][registry]") {
  Tensor p = Tensor::zeros({3});
  const std::vector<OptimizerParamGroup> groups{OptimizerParamGroup({p})};
  CHECK_THROWS_AS(make_optimizer({"Adam", {{"momentum", 0.9}}}, groups), ValueError);
  CHECK_THROWS_WITH(make_optimizer({"Adam", {{"momentum", 0.9}}}, groups), Contains("'momentum'"));
  CHECK_THROWS_WITH(as_functional_optim("Rprop", {{"weight_decay", 0.1}}), Contains("'weight_decay'"));
  CHECK_THROWS_WITH(make_functional({"Adadelta", {{"betas", std::vector<double>{0.9, 0.99}}}}, {p}),
                    Contains("'betas'"));
  CHECK_THROWS_AS(make_options({"Adam", {{"lr", std::string("fast")}}}), TypeError);
  CHECK_THROWS_WITH(make_options({"Adam", {{"lr", std::string("fast")}}}), Contains("lr"));
  CHECK_THROWS_AS(make_options({"Adam", {{"betas", 0.9}}}), TypeError);
  // invalid values: torch's texts, naming the optimizer
  CHECK_THROWS_WITH(make_options({"Adam", {{"lr", -1.0}}}), Contains("Adam") && Contains("Invalid learning rate"));
  CHECK_THROWS_WITH(make_optimizer({"Rprop", {{"etas", std::vector<double>{2.0, 3.0}}}}, groups),
                    Contains("Invalid eta values: 2.0, 3.0"));
  // SGD's lr is required
  CHECK_THROWS_WITH(make_options({"SGD", {{"momentum", 0.9}}}),
                    Equals("SGD: parameter group didn't specify a value of required optimization parameter lr"));
  CHECK_THROWS_AS(as_functional_optim("SGD"), ValueError);
  CHECK(as_functional_optim("SGD", {{"lr", 0.1}})->lr() == 0.1);
}

TEST_CASE("make_optimizer keeps per-group options and rejects foreign ones", "[optB][registry]") {
  Tensor a = Tensor::zeros({3}), b = Tensor::zeros({2});
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<Tensor>{a}, AdamOptions(0.5));
  groups.emplace_back(std::vector<Tensor>{b});
  auto opt = make_optimizer({"Adam", {{"lr", 0.01}}}, groups);
  CHECK(opt->param_groups()[0].options->get_lr() == 0.5);
  CHECK(opt->param_groups()[1].options->get_lr() == 0.01);
  groups[0].options = std::make_unique<SGDOptions>(0.1);
  CHECK_THROWS_AS(make_optimizer({"Adam", {}}, groups), TypeError);
  CHECK_THROWS_AS(make_optimizer({"Adam", {}}, {}), ValueError);  // empty list, as torch
}

TEST_CASE("register_optimizer never overwrites", "[optB][registry]") {
  CHECK_FALSE(register_optimizer("Adam", optimizer_factories<Adamax, FunctionalAdamax>()));
  CHECK_FALSE(register_optimizer("ADAM", optimizer_factories<Adamax, FunctionalAdamax>()));
  Tensor p = Tensor::zeros({3});
  CHECK(make_optimizer({"Adam", {}}, {OptimizerParamGroup({p})})->name() == "Adam");

  // A new name (unique to this test; the registry is process-wide).
  const std::string name = "optB_test_AdamClone";
  const bool first = register_optimizer(name, optimizer_factories<Adam, FunctionalAdam>());
  CHECK_FALSE(register_optimizer(name, optimizer_factories<Adamax>()));
  (void)first;  // false only if this test ran before in this process
  const auto names = registered_optimizers();
  CHECK(std::count(names.begin(), names.end(), name) == 1);
  auto opt = make_optimizer({name, {{"lr", 0.25}}}, {OptimizerParamGroup({p})});
  CHECK(opt->name() == "Adam");
  CHECK(opt->defaults().get_lr() == 0.25);
  CHECK(as_functional_optim(name)->name() == "FunctionalAdam");

  // Without a functional form.
  const std::string plain = "optB_test_PlainAdamax";
  register_optimizer(plain, optimizer_factories<Adamax>());
  CHECK(make_optimizer({plain, {}}, {OptimizerParamGroup({p})})->name() == "Adamax");
  CHECK_THROWS_WITH(as_functional_optim(plain),
                    Equals("as_functional_optim: Optimizer " + plain + " does not have a functional counterpart!"));
  CHECK_THROWS_WITH(make_functional({plain, {}}, {p}), Contains("does not have a functional counterpart!"));

  // Incomplete factories or an empty name are rejected.
  CHECK_THROWS_AS(register_optimizer("", optimizer_factories<Adam>()), ValueError);
  OptimizerFactories incomplete = optimizer_factories<Adam>();
  incomplete.optimizer = nullptr;
  CHECK_THROWS_AS(register_optimizer("optB_test_incomplete", incomplete), ValueError);
  const auto after = registered_optimizers();
  CHECK(std::count(after.begin(), after.end(), "optB_test_incomplete") == 0);
}

TEST_CASE("OptimizerSpec JSON: format and errors", "[optB][registry]") {
  const OptimizerSpec spec{"Adam", {{"lr", 0.001}, {"betas", std::vector<double>{0.9, 0.999}}, {"amsgrad", true}}};
  CHECK(spec.to_json() ==
        R"({"hyperparameters":{"amsgrad":true,"betas":[0.9,0.999],"lr":0.001},"name":"Adam"})");
  CHECK(OptimizerSpec::from_json(R"({"name": "SGD"})") == OptimizerSpec{"SGD", {}});
  for (double x : {1e-300, 0.1 + 0.2, 5e-324, 1.7976931348623157e308, -0.0}) {
    const OptimizerSpec s{"Adam", {{"lr", x}}};
    const double y = std::get<double>(OptimizerSpec::from_json(s.to_json()).hyperparameters.at("lr"));
    CHECK(std::memcmp(&x, &y, sizeof x) == 0);
  }
  CHECK(OptimizerSpec::from_json(R"({"name": "SGD", "hyperparameters": {"lr": 1}})") ==
        OptimizerSpec{"SGD", {{"lr", 1.0}}});
  const char* op_prefix = "OptimizerSpec.from_json";
  for (const char* bad : {"", "{", "[1]", R"({"hyperparameters": {}})", R"({"name": 3})",
                          R"({"name": "Adam", "hyperparameters": [1]})", R"({"name": "Adam", "lrr": 1})",
                          R"({"name": "Adam", "hyperparameters": {"betas": ["a", 1]}})",
                          R"({"name": "Adam", "hyperparameters": {"x": null}})"}) {
    INFO(bad);
    CHECK_THROWS_AS(OptimizerSpec::from_json(bad), ValueError);
    CHECK_THROWS_WITH(OptimizerSpec::from_json(bad), Contains(op_prefix));
  }
  CHECK_THROWS_WITH(OptimizerSpec::from_json(R"({"name": "Adam", "lrr": 1})"), Contains("'lrr'"));
  const OptimizerSpec nan_spec{"Adam", {{"lr", std::numeric_limits<double>::quiet_NaN()}}};
  CHECK_THROWS_AS(nan_spec.to_json(), ValueError);
  const OptimizerSpec inf_spec{"Adam", {{"betas", std::vector<double>{0.9, INFINITY}}}};
  CHECK_THROWS_WITH(inf_spec.to_json(), Contains("'betas'"));
}

TEST_CASE("spec_of: typed options name their registered optimizer, with every hyperparameter", "[registry]") {
  CHECK(spec_of(AdamOptions(1e-3)) == OptimizerSpec{"Adam", AdamOptions(1e-3).to_hyperparams()});
  CHECK(spec_of(AdamWOptions(0.5)).name == "AdamW");
  CHECK(spec_of(SGDOptions(0.1).momentum(0.9)).hyperparameters.at("momentum") == HyperValue(0.9));
  CHECK(spec_of(NAdamOptions()).name == "NAdam");
  CHECK(spec_of(RAdamOptions()).name == "RAdam");
  // the spec builds the same options back
  const OptimizerSpec s = spec_of(RMSpropOptions(0.02).centered(true));
  CHECK(make_options(s)->to_hyperparams() == RMSpropOptions(0.02).centered(true).to_hyperparams());
  struct Unregistered : OptionsCRTP<Unregistered> {
    double lr_ = 0.1;
    double lr() const { return lr_; }
    Unregistered& lr(double v) { lr_ = v; return *this; }
    Hyperparams to_hyperparams() const override { return {{"lr", lr_}}; }
    void set_hyperparams(const Hyperparams&) override {}
    void validate(const std::string&) const override {}
  };
  CHECK_THROWS_AS(spec_of(Unregistered()), TypeError);
  CHECK_THROWS_WITH(spec_of(Unregistered(), "ZeroRedundancyOptimizer"), Contains("ZeroRedundancyOptimizer"));
}

TEST_CASE("Hyperparameters accept integer literals as numbers", "[registry]") {
  // {"momentum", 0} is 0.0 (a plain std::variant would refuse the int).
  const Hyperparams h{{"lr", 1}, {"momentum", 0}, {"nesterov", false}, {"dampening", 0L}};
  CHECK(std::get<double>(h.at("lr")) == 1.0);
  CHECK(std::get<double>(h.at("momentum")) == 0.0);
  CHECK(std::get<bool>(h.at("nesterov")) == false);
  auto o = make_options({"SGD", {{"lr", 2}, {"momentum", 0}, {"weight_decay", 0}}});
  CHECK(o->get_lr() == 2.0);
  CHECK(make_options({"SGD", {{"lr", 1}, {"momentum", 1}}})->to_hyperparams().at("momentum") == HyperValue(1.0));
  // the JSON form is the same as for a double
  CHECK(OptimizerSpec{"SGD", {{"lr", 1}}}.to_json() == OptimizerSpec{"SGD", {{"lr", 1.0}}}.to_json());
}
