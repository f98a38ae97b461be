#include <catch2/catch.hpp>

#include <cmath>

#include "dopt/optim/adamw.hpp"
#include "optimizer_tests.hpp"

namespace {

// Independent scalar transcription of spec section 3.4 (torch 1.13 AdamW).
template <class T>
struct RefAdamW {
  double lr, b1, b2, eps, wd;
  bool amsgrad, maximize;
  float step = 0;  // torch's float32 step tensor
  std::vector<T> m, v, vmax;
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    if (m.empty()) m.assign(p.size(), T(0)), v.assign(p.size(), T(0)), vmax.assign(p.size(), T(0));
    step = step + 1.0f;
    const double s = step;
    const double bc1 = 1 - std::pow(b1, s), bc2 = 1 - std::pow(b2, s);
    const T neg_step_size = T(-(lr / bc1)), bc2_sqrt = T(std::sqrt(bc2));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const T gi = maximize ? -g[i] : g[i];
      p[i] = p[i] * T(1 - lr * wd);  // unconditional, before the moments
      m[i] = std::fma(T(1 - b1), gi, m[i] * T(b1));
      v[i] = std::fma(T(T(1 - b2) * gi), gi, v[i] * T(b2));
      T base = v[i];
      if (amsgrad) base = vmax[i] = std::max(vmax[i], v[i]);
      const T denom = std::sqrt(base) / bc2_sqrt + T(eps);
      p[i] = p[i] + (neg_step_size * m[i]) / denom;
    }
  }
};

template <class T>
RefAdamW<T> ref_of(const AdamWOptions& o) {
  return RefAdamW<T>{o.lr(), o.betas()[0], o.betas()[1], o.eps(), o.weight_decay(), o.amsgrad(), o.maximize(),
                     0.0f, {}, {}, {}};
}

}  // namespace

TEMPLATE_TEST_CASE("AdamW matches the spec's operation order bit for bit", "[optA][adamw]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, AdamWOptions>> cases = {
      {"default", AdamWOptions()},
      {"lr", AdamWOptions(0.05)},
      {"weight_decay 0 (multiply by 1)", AdamWOptions(0.01).weight_decay(0.0)},
      {"large weight_decay", AdamWOptions(0.01).weight_decay(0.5)},
      {"betas+eps", AdamWOptions(0.02).betas({0.8, 0.95}).eps(1e-3)},
      {"amsgrad", AdamWOptions(0.01).amsgrad(true)},
      {"maximize", AdamWOptions(0.01).maximize(true)},
      {"amsgrad+maximize+wd", AdamWOptions(0.03).amsgrad(true).maximize(true).weight_decay(0.1)},
  };
  match_reference<AdamW, T>(cases, 6, ref_of<T>, [](const auto& st, const auto& ref, const auto& o) {
    CHECK(st.size() == (o.amsgrad() ? 4u : 3u));
    check_step_counter(st.at("step"), DType::float32, 6.0);
    DOPT_REQUIRE_BITWISE(st.at("exp_avg"), ref.m);
    DOPT_REQUIRE_BITWISE(st.at("exp_avg_sq"), ref.v);
    if (o.amsgrad()) DOPT_REQUIRE_BITWISE(st.at("max_exp_avg_sq"), ref.vmax);
  });
}

TEST_CASE("AdamW differs from Adam with the same weight decay", "[optA][adamw]") {
  // Decoupled decay is not Adam's L2 term: the two must diverge.
  const auto init = values<float>(kRefNumel, 3);
  Tensor a = tensor_of(init), b = tensor_of(init);
  AdamW w({a}, AdamWOptions(0.01).weight_decay(0.1));
  Adam l2({b}, AdamOptions(0.01).weight_decay(0.1));
  const auto g = values<float>(init.size(), 4);
  a.set_grad(tensor_of(g));
  b.set_grad(tensor_of(g));
  w.step();
  l2.step();
  CHECK_FALSE(a.equal(b));
}

TEST_CASE("AdamW options: defaults, torch names, validation", "[optA][adamw]") {
  const AdamWOptions d;
  CHECK(d.lr() == 1e-3);
  CHECK(d.weight_decay() == 1e-2);
  CHECK(d.eps() == 1e-8);
  CHECK(d.betas() == Pair{0.9, 0.999});
  CHECK_FALSE(d.amsgrad());
  CHECK_FALSE(d.maximize());
  const Hyperparams h = d.to_hyperparams();
  CHECK(h == Hyperparams{{"lr", 1e-3}, {"betas", std::vector<double>{0.9, 0.999}}, {"eps", 1e-8},
                         {"weight_decay", 1e-2}, {"amsgrad", false}, {"maximize", false}});
  AdamWOptions back(0.5);
  back.set_hyperparams(h);
  CHECK(back.to_hyperparams() == h);
  CHECK_THROWS_AS(back.set_hyperparams({{"momentum", 0.9}}), ValueError);

  Tensor p = Tensor::zeros({3});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(AdamW({p}, AdamWOptions(-1e-3)), Contains("Invalid learning rate"));
  CHECK_THROWS_WITH(AdamW({p}, AdamWOptions().eps(-1)), Contains("Invalid epsilon value"));
  CHECK_THROWS_WITH(AdamW({p}, AdamWOptions().betas({1.0, 0.999})), Contains("Invalid beta parameter at index 0"));
  CHECK_THROWS_WITH(AdamW({p}, AdamWOptions().betas({0.9, -0.1})), Contains("Invalid beta parameter at index 1"));
  CHECK_THROWS_WITH(AdamW({p}, AdamWOptions().weight_decay(-0.1)), Contains("Invalid weight_decay value"));
  CHECK_THROWS_AS(AdamW({p}, AdamWOptions().weight_decay(-0.1)), ValueError);
  CHECK_THROWS_WITH(AdamW({p}, AdamWOptions().weight_decay(-0.1)), Contains("AdamW"));
}

TEST_CASE("AdamW amsgrad enabled after state creation is a StateError", "[optA][adamw]") {
  Tensor p = tensor_of(values<float>(8, 1));
  AdamW opt({p}, AdamWOptions());
  p.set_grad(tensor_of(values<float>(8, 2)));
  opt.step();
  opt.param_groups()[0].options_as<AdamWOptions>().amsgrad(true);
  CHECK_THROWS_AS(opt.step(), StateError);
}

TEST_CASE("AdamW keeps the Optimizer base contract", "[optA][adamw]") {
  check_optimizer_contract<AdamW>(AdamWOptions(0.01).amsgrad(true),
                                              AdamWOptions(0.5).weight_decay(0.3).amsgrad(true), false);
}
