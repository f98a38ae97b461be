#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "dopt/optim/adamax.hpp"
#include "optimizer_tests.hpp"

namespace {

// Independent scalar transcription of spec section 3.7 (torch 1.13 Adamax).
template <class T>
struct RefAdamax {
  double lr, b1, b2, eps, wd;
  bool maximize;
  std::vector<T> m, u;
  float step = 0.0f;  // torch's float32 step tensor
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    if (m.empty()) m.assign(p.size(), T(0)), u.assign(p.size(), T(0));
    step = step + 1.0f;
    const double clr = lr / (1.0 - std::pow(b1, static_cast<double>(step)));
    for (std::size_t i = 0; i < p.size(); ++i) {
      T gi = maximize ? -g[i] : g[i];
      if (wd != 0) gi = std::fma(T(wd), p[i], gi);
      m[i] = m[i] * T(b1);
      m[i] = std::fma(T(1 - b1), gi, m[i]);
      const T a = u[i] * T(b2), b = std::abs(gi) + T(eps);
      u[i] = (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<T>::quiet_NaN() : std::max(a, b);
      const T num = T(-clr) * m[i];
      p[i] = p[i] + num / u[i];
    }
  }
};

template <class T>
RefAdamax<T> ref_of(const AdamaxOptions& o) {
  return RefAdamax<T>{o.lr(), o.betas()[0], o.betas()[1], o.eps(), o.weight_decay(), o.maximize(), {}, {}};
}

}  // namespace

TEMPLATE_TEST_CASE("Adamax matches the spec's operation order bit for bit", "[optB][adamax]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, AdamaxOptions>> cases = {
      {"default", AdamaxOptions()},
      {"betas+eps", AdamaxOptions(0.01).betas({0.8, 0.95}).eps(1e-3)},
      {"weight_decay", AdamaxOptions(0.01).weight_decay(0.3)},
      {"maximize", AdamaxOptions(0.01).maximize(true)},
      // eps large against |g|: the max is decided by |g| + eps, not |g|
      {"large eps", AdamaxOptions(0.02).eps(0.5)},
      {"all", AdamaxOptions(0.05).betas({0.5, 0.6}).eps(1e-4).weight_decay(0.1).maximize(true)},
  };
  match_reference<Adamax, T>(cases, 25, ref_of<T>, [](const auto& st, const auto& ref, const auto&) {
    CHECK(st.size() == 3u);
    check_step_counter(st.at("step"), DType::float32, 25.0);
    DOPT_REQUIRE_BITWISE(st.at("exp_avg"), ref.m);
    DOPT_REQUIRE_BITWISE(st.at("exp_inf"), ref.u);
  });
}

TEST_CASE("Adamax exp_inf max propagates NaN", "[optB][adamax]") {
  Tensor p = tensor_of(values<float>(5, 1));
  Adamax opt({p}, AdamaxOptions(0.01));
  std::vector<float> g = values<float>(5, 2);
  g[3] = std::numeric_limits<float>::quiet_NaN();
  p.set_grad(tensor_of(g));
  opt.step();
  // A finite gradient afterwards: max(NaN * beta2, |g| + eps) is still NaN.
  p.set_grad(tensor_of(values<float>(5, 3)));
  opt.step();
  const Tensor& u = opt.state().at(p.key()).at("exp_inf");
  for (int i = 0; i < 5; ++i) {
    INFO("element " << i);
    CHECK(std::isnan(u.at(i)) == (i == 3));
    CHECK(std::isnan(p.at(i)) == (i == 3));
  }
}

TEST_CASE("Adamax's float32 step counter saturates at 2^24 like torch", "[optB][adamax]") {
  Tensor p = tensor_of(values<float>(4, 1));
  Adamax opt({p});
  p.set_grad(tensor_of(values<float>(4, 2)));
  opt.step();
  opt.state().at(p.key()).at("step").fill_(16777216.0);
  opt.step();
  CHECK(opt.state().at(p.key()).at("step").item() == 16777216.0);
}

TEST_CASE("Adamax options: defaults, torch names, validation", "[optB][adamax]") {
  const AdamaxOptions d;
  CHECK(d.lr() == 2e-3);
  CHECK(d.betas() == Pair{0.9, 0.999});
  CHECK(d.eps() == 1e-8);
  CHECK(d.weight_decay() == 0.0);
  CHECK_FALSE(d.maximize());
  const Hyperparams h = d.to_hyperparams();
  CHECK(h == Hyperparams{{"lr", 2e-3}, {"betas", std::vector<double>{0.9, 0.999}}, {"eps", 1e-8},
                         {"weight_decay", 0.0}, {"maximize", false}});
  AdamaxOptions back(0.5);
  back.betas({0.1, 0.2}).maximize(true);
  back.set_hyperparams(h);
  CHECK(back.to_hyperparams() == h);
  CHECK_THROWS_AS(back.set_hyperparams({{"amsgrad", false}}), ValueError);
  CHECK_THROWS_WITH(back.set_hyperparams({{"amsgrad", false}}), Contains("'amsgrad'"));
  CHECK_THROWS_AS(back.set_hyperparams({{"betas", 0.9}}), TypeError);
  CHECK_THROWS_AS(back.set_hyperparams({{"maximize", 1.0}}), TypeError);

  Tensor p = Tensor::zeros({3});
  CHECK_THROWS_WITH(Adamax({p}, AdamaxOptions(-0.5)), Equals("Adamax: Invalid learning rate: -0.5"));
  CHECK_THROWS_WITH(Adamax({p}, AdamaxOptions().eps(-1e-8)), Equals("Adamax: Invalid epsilon value: -1e-08"));
  CHECK_THROWS_WITH(Adamax({p}, AdamaxOptions().betas({1.0, 0.9})),
                    Equals("Adamax: Invalid beta parameter at index 0: 1.0"));
  CHECK_THROWS_WITH(Adamax({p}, AdamaxOptions().betas({0.9, -0.1})),
                    Equals("Adamax: Invalid beta parameter at index 1: -0.1"));
  CHECK_THROWS_WITH(Adamax({p}, AdamaxOptions().weight_decay(-2)),
                    Equals("Adamax: Invalid weight_decay value: -2.0"));
  CHECK_THROWS_AS(Adamax({p}, AdamaxOptions(std::nan(""))), ValueError);
  CHECK_NOTHROW(Adamax({p}, AdamaxOptions(0.0).betas({0.0, 0.0}).eps(0.0)));
  // A group's own options are validated when the group is added.
  Adamax opt({p});
  Tensor q = Tensor::zeros({2});
  CHECK_THROWS_AS(opt.add_param_group(OptimizerParamGroup({q}, AdamaxOptions(-1.0))), ValueError);
}

TEST_CASE("Adamax rejects a state that does not match the parameter", "[optB][adamax]") {
  Tensor p = tensor_of(values<float>(4, 1));
  Adamax opt({p});
  p.set_grad(tensor_of(values<float>(4, 2)));
  opt.step();
  opt.state().at(p.key())["exp_inf"] = Tensor::zeros({3});
  CHECK_THROWS_AS(opt.step(), StateError);
  opt.state().at(p.key()).erase("exp_inf");
  CHECK_THROWS_WITH(opt.step(), Contains("Adamax.step") && Contains("exp_inf"));
  CHECK(opt.state().at(p.key()).at("step").item() == 1.0);
}

TEST_CASE("Adamax keeps the Optimizer base contract", "[optB][adamax]") {
  check_optimizer_contract<Adamax>(AdamaxOptions(0.01).weight_decay(0.1),
                                               AdamaxOptions(0.5).betas({0.5, 0.5}), false);
}
