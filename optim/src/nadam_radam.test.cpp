// NAdam and RAdam (torch 1.13): bitwise against a scalar transcription of
// torch's single-tensor code, the Optimizer contract, the functional forms,
// the registry, and the refusal of parameters off the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "dopt/optim/internal/device_step.hpp"
#include "dopt/optim/functional.hpp"
#include "dopt/optim/nadam.hpp"
#include "dopt/optim/radam.hpp"
#include "dopt/optim/registry.hpp"
#include "optimizer_tests.hpp"

namespace {

// torch 1.13 _single_tensor_nadam, element by element: scalars in double,
// rounded to T once; mu_product a float32 0-d tensor updated in float32
// before mu_product_next is formed from it (mu counted twice, as torch 1.13).
template <class T>
struct RefNAdam {
  double lr, b1, b2, eps, wd, md;
  std::vector<T> m, v;
  float step = 0.0f, mu_product = 1.0f;
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    if (m.empty()) m.assign(p.size(), T(0)), v.assign(p.size(), T(0));
    step = step + 1.0f;
    const double t = step;
    const double bc2 = 1 - std::pow(b2, t);
    const double mu = b1 * (1. - 0.5 * std::pow(0.96, t * md));
    const double mu_next = b1 * (1. - 0.5 * std::pow(0.96, (t + 1) * md));
    mu_product = mu_product * static_cast<float>(mu);
    const float mu_product_next = (mu_product * static_cast<float>(mu)) * static_cast<float>(mu_next);
    const T c1 = T(-lr * (1. - mu) / (1. - mu_product)), c2 = T(-lr * mu_next / (1. - mu_product_next));
    for (std::size_t i = 0; i < p.size(); ++i) {
      T gi = g[i];
      if (wd != 0) gi = std::fma(T(wd), p[i], gi);  // grad.add(p, alpha=wd)
      m[i] = std::fma(T(1 - b1), gi, m[i] * T(b1));
      v[i] = std::fma(T(1 - b2) * gi, gi, v[i] * T(b2));
      const T denom = std::sqrt(v[i] / T(bc2)) + T(eps);
      p[i] = p[i] + (c1 * gi) / denom;
      p[i] = p[i] + (c2 * m[i]) / denom;
    }
  }
};

// torch 1.13 _single_tensor_radam, element by element.
template <class T>
struct RefRAdam {
  double lr, b1, b2, eps, wd;
  std::vector<T> m, v;
  float step = 0.0f;
  int rectified_steps = 0;
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    if (m.empty()) m.assign(p.size(), T(0)), v.assign(p.size(), T(0));
    step = step + 1.0f;
    const double t = step;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    const double rho_inf = 2 / (1 - b2) - 1;
    const double rho_t = rho_inf - 2 * t * std::pow(b2, t) / bc2;
    const bool rect = rho_t > 5.;
    rectified_steps += rect;
    const double r = rect ? std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) : 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      T gi = g[i];
      if (wd != 0) gi = std::fma(T(wd), p[i], gi);
      m[i] = std::fma(T(1 - b1), gi, m[i] * T(b1));
      v[i] = std::fma(T(1 - b2) * gi, gi, v[i] * T(b2));
      const T bc = m[i] / T(bc1);
      if (rect) {
        const T adaptive = (T(1) / (std::sqrt(v[i]) + T(eps))) * T(std::sqrt(bc2));
        p[i] = p[i] - ((bc * T(lr)) * adaptive) * T(r);
      } else {
        p[i] = p[i] - bc * T(lr);
      }
    }
  }
};

struct FakeStepper final : detail::DeviceStepper {
  int calls = 0;
  void step(const OptimizerOptions&, const std::vector<Tensor>&, const std::vector<Tensor>&,
            const std::vector<ParamState*>&) override {
    ++calls;
  }
};

struct RestoreStepper {
  detail::DeviceStepper* previous;
  ~RestoreStepper() { detail::register_device_stepper(DeviceType::CUDA, previous); }
};

}  // namespace

TEMPLATE_TEST_CASE("NAdam matches torch 1.13's operation order bit for bit", "[nadam]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, NAdamOptions>> cases = {
      {"default", NAdamOptions()},
      {"lr+betas+eps", NAdamOptions(0.01).betas({0.8, 0.95}).eps(1e-3)},
      {"weight_decay", NAdamOptions(0.01).weight_decay(0.3)},
      {"momentum_decay", NAdamOptions(0.02).momentum_decay(0.1)},
  };
  const auto ref_of_t = [](const NAdamOptions& o) {
    return RefNAdam<T>{o.lr(), o.betas()[0], o.betas()[1], o.eps(), o.weight_decay(), o.momentum_decay(), {}, {}};
  };
  match_reference<NAdam, T>(cases, 25, ref_of_t, [](const auto& st, const auto& ref, const auto&) {
    CHECK(st.size() == 4u);
    CHECK(st.at("step").dtype() == DType::float32);
    CHECK(st.at("step").item() == 25.0);
    CHECK(st.at("mu_product").dtype() == DType::float32);
    CHECK(st.at("mu_product").dim() == 0);
    CHECK(static_cast<float>(st.at("mu_product").item()) == ref.mu_product);
    DOPT_REQUIRE_BITWISE(st.at("exp_avg"), ref.m);
    DOPT_REQUIRE_BITWISE(st.at("exp_avg_sq"), ref.v);
  });
}

TEMPLATE_TEST_CASE("RAdam matches torch 1.13's operation order bit for bit, both branches", "[radam]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, RAdamOptions>> cases = {
      {"default", RAdamOptions()},
      {"lr+betas+eps", RAdamOptions(0.01).betas({0.8, 0.95}).eps(1e-3)},
      {"weight_decay", RAdamOptions(0.01).weight_decay(0.3)},
  };
  const auto ref_of_t = [](const RAdamOptions& o) {
    return RefRAdam<T>{o.lr(), o.betas()[0], o.betas()[1], o.eps(), o.weight_decay(), {}, {}};
  };
  match_reference<RAdam, T>(cases, 12, ref_of_t, [](const auto& st, const auto& ref, const auto&) {
    // Both the plain (rho_t <= 5) and the rectified branch ran.
    CHECK(ref.rectified_steps > 0);
    CHECK(ref.rectified_steps < 12);
    CHECK(st.size() == 3u);
    CHECK(st.at("step").item() == 12.0);
    DOPT_REQUIRE_BITWISE(st.at("exp_avg"), ref.m);
    DOPT_REQUIRE_BITWISE(st.at("exp_avg_sq"), ref.v);
  }, 9);
}

TEST_CASE("NAdam and RAdam options: defaults, torch names, validation", "[nadam][radam]") {
  const NAdamOptions n;
  CHECK(n.to_hyperparams() == Hyperparams{{"lr", 2e-3}, {"betas", std::vector<double>{0.9, 0.999}}, {"eps", 1e-8},
                                          {"weight_decay", 0.0}, {"momentum_decay", 4e-3}});
  const RAdamOptions r;
  CHECK(r.to_hyperparams() == Hyperparams{{"lr", 1e-3}, {"betas", std::vector<double>{0.9, 0.999}}, {"eps", 1e-8},
                                          {"weight_decay", 0.0}});
  NAdamOptions back;
  back.set_hyperparams({{"momentum_decay", 0.5}, {"lr", 1}});  // an integer literal is a number
  CHECK(back.momentum_decay() == 0.5);
  CHECK(back.lr() == 1.0);
  CHECK_THROWS_WITH(back.set_hyperparams({{"maximize", false}}), Contains("'maximize'"));
  CHECK_THROWS_AS(RAdamOptions().set_hyperparams({{"momentum_decay", 0.1}}), ValueError);
  Tensor p = Tensor::zeros({3});
  CHECK_THROWS_WITH(NAdam({p}, NAdamOptions().momentum_decay(-1)),
                    Equals("NAdam: Invalid momentum_decay value: -1.0"));
  CHECK_THROWS_WITH(NAdam({p}, NAdamOptions(-0.5)), Equals("NAdam: Invalid learning rate: -0.5"));
  CHECK_THROWS_WITH(RAdam({p}, RAdamOptions().betas({1.0, 0.9})),
                    Equals("RAdam: Invalid beta parameter at index 0: 1.0"));
  CHECK_THROWS_WITH(RAdam({p}, RAdamOptions().weight_decay(-2)), Equals("RAdam: Invalid weight_decay value: -2.0"));
}

TEST_CASE("NAdam and RAdam keep the Optimizer base contract", "[nadam][radam]") {
  SECTION("NAdam") {
    check_optimizer_contract<NAdam>(NAdamOptions(0.01).weight_decay(0.1),
                                                NAdamOptions(0.5).betas({0.5, 0.5}), false);
  }
  SECTION("RAdam") {
    check_optimizer_contract<RAdam>(RAdamOptions(0.01).weight_decay(0.1),
                                                RAdamOptions(0.5).betas({0.5, 0.5}), false);
  }
}

TEST_CASE("NAdam and RAdam: functional forms and registry equal the classes bit for bit", "[nadam][radam][functional]") {
  for (const char* name : {"NAdam", "RAdam"}) {
    DYNAMIC_SECTION(name) {
      const OptimizerSpec spec{name, {{"lr", 0.01}, {"weight_decay", 0.05}}};
      Tensor a = tensor_of(values<float>(kRefNumel, 3));
      Tensor b = a.clone(), c = a.clone();
      auto cls = make_optimizer(spec, {OptimizerParamGroup({a})});
      CHECK(cls->name() == name);
      auto fn = make_functional(spec, {b});
      CHECK(fn->name() == std::string("Functional") + name);
      auto single = as_functional_optim(std::string("_Functional") + name, spec.hyperparameters);
      for (int t = 0; t < 8; ++t) {
        const Tensor g = tensor_of(values<float>(kRefNumel, 50 + t, 2.0));
        a.set_grad(g.clone());
        cls->step();
        fn->step({g.clone()});
        single->step_param(c, g.clone());
        REQUIRE(a.equal(b));
        REQUIRE(a.equal(c));
      }
      // typed options name the registered class
      CHECK(spec_of(cls->defaults()).name == name);
    }
  }
}

TEST_CASE("NAdam and RAdam refuse parameters off the CPU, naming the optimizer, before any change", "[nadam][radam][device]") {
  std::vector<float> probe(1), host(4, 1.0f), ghost(4, 0.5f);
  auto fake_cuda = [](std::vector<float>& v) {
    return Tensor::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, DType::float32, Device::cuda(0));
  };
  RestoreStepper restore{detail::device_stepper_for(fake_cuda(probe))};
  FakeStepper fake;
  detail::register_device_stepper(DeviceType::CUDA, &fake);
  for (const char* name : {"NAdam", "RAdam"}) {
    DYNAMIC_SECTION(name) {
      Tensor p = fake_cuda(host);
      p.set_grad(fake_cuda(ghost));
      Tensor cpu = Tensor::full({2}, 1.0);
      cpu.set_grad(Tensor::full({2}, 0.5));
      auto opt = make_optimizer({name, {}}, {OptimizerParamGroup({cpu, p})});
      CHECK_THROWS_AS(opt->step(), NotSupportedError);
      CHECK_THROWS_WITH(opt->step(), Contains(std::string(name) + ".step") && Contains(name) &&
                                         Contains("cuda:0") && Contains("CPU only"));
      CHECK(fake.calls == 0);
      CHECK(opt->state().empty());              // nothing was created
      CHECK(cpu.equal(Tensor::full({2}, 1.0)));  // nothing was updated
      auto fn = make_functional({name, {}}, {p});
      CHECK_THROWS_AS(fn->step({p.grad()}), NotSupportedError);
      CHECK_THROWS_WITH(fn->step_param(p, p.grad()), Contains(name) && Contains("CPU only"));
      CHECK(fake.calls == 0);
    }
  }
}

TEST_CASE("NAdam keeps mu_product in float32 for float64 parameters", "[nadam]") {
  Tensor p = Tensor::full({3}, 1.0, DType::float64);
  NAdam opt({p});
  p.set_grad(Tensor::full({3}, 0.25, DType::float64));
  opt.step();
  opt.step();
  const Tensor& mp = opt.state().at(p.key()).at("mu_product");
  CHECK(mp.dtype() == DType::float32);
  const double mu1 = 0.9 * (1. - 0.5 * std::pow(0.96, 1 * 4e-3)), mu2 = 0.9 * (1. - 0.5 * std::pow(0.96, 2 * 4e-3));
  CHECK(mp.item() == static_cast<double>((1.0f * static_cast<float>(mu1)) * static_cast<float>(mu2)));
}
