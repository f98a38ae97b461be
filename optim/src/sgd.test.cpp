#include <catch2/catch.hpp>

#include <cmath>
#include <type_traits>

#include "dopt/optim/sgd.hpp"
#include "optimizer_tests.hpp"

namespace {

// Independent scalar transcription of spec section 3.2 (torch 1.13 SGD).
template <class T>
struct RefSGD {
  double lr, momentum, dampening, wd;
  bool nesterov, maximize;
  bool use_fma = true;  // false: a deliberately wrong variant (no FMA) to show the comparison has teeth
  std::vector<T> buf;
  T fma(T a, T b, T c) const { return use_fma ? std::fma(a, b, c) : a * b + c; }
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    const bool first = buf.empty();
    if (momentum != 0 && first) buf.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      T d = maximize ? -g[i] : g[i];
      if (wd != 0) d = fma(T(wd), p[i], d);
      if (momentum != 0) {
        if (first) buf[i] = d;
        else buf[i] = fma(T(1.0 - dampening), d, buf[i] * T(momentum));
        d = nesterov ? fma(T(momentum), buf[i], d) : buf[i];
      }
      p[i] = fma(T(-lr), d, p[i]);
    }
  }
};

template <class T>
RefSGD<T> ref_of(const SGDOptions& o) {
  return RefSGD<T>{o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov(), o.maximize(), true, {}};
}

}  // namespace

TEMPLATE_TEST_CASE("SGD matches the spec's operation order bit for bit", "[optA][sgd]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, SGDOptions>> cases = {
      {"plain", SGDOptions(0.1)},
      {"weight_decay", SGDOptions(0.05).weight_decay(0.3)},
      {"maximize", SGDOptions(0.1).maximize(true)},
      {"momentum", SGDOptions(0.1).momentum(0.9)},
      {"momentum+dampening", SGDOptions(0.1).momentum(0.9).dampening(0.3)},
      {"nesterov", SGDOptions(0.1).momentum(0.8).nesterov(true)},
      {"nesterov+wd+maximize", SGDOptions(0.07).momentum(0.9).nesterov(true).weight_decay(0.1).maximize(true)},
      {"momentum+dampening+wd+maximize",
       SGDOptions(0.2).momentum(0.5).dampening(0.5).weight_decay(0.01).maximize(true)},
  };
  match_reference<SGD, T>(cases, 6, ref_of<T>, [](const auto& st, const auto& ref, const auto& o) {
    if (o.momentum() != 0) {
      REQUIRE(st.size() == 1);
      DOPT_REQUIRE_BITWISE(st.at("momentum_buffer"), ref.buf);
    } else {
      CHECK(st.empty());  // torch's None buffer is not stored
    }
  });
}

TEST_CASE("SGD reference comparison detects a missing FMA", "[optA][sgd]") {
  // The bitwise comparisons above would fail for an implementation without FMA.
  const auto init = values<float>(kRefNumel, 7);
  auto fused = ref_of<float>(SGDOptions(0.1).momentum(0.9).weight_decay(0.1));
  auto plain = fused;
  plain.use_fma = false;
  std::vector<float> a = init, b = init;
  for (int t = 0; t < 6; ++t) {
    const auto g = values<float>(init.size(), 1000 + t, 2.0);
    fused(a, g);
    plain(b, g);
  }
  CHECK(a != b);
}

TEST_CASE("SGD first momentum step copies the gradient without dampening", "[optA][sgd]") {
  Tensor p = tensor_of(values<float>(kRefNumel, 1));
  const auto g = values<float>(kRefNumel, 2);
  SGD opt({p}, SGDOptions(0.1).momentum(0.9).dampening(0.5).maximize(true));
  p.set_grad(tensor_of(g));
  opt.step();
  std::vector<float> neg_g(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) neg_g[i] = -g[i];
  DOPT_REQUIRE_BITWISE(opt.state().at(p.key()).at("momentum_buffer"), neg_g);
}

TEST_CASE("SGD options: required lr, torch names, validation", "[optA][sgd]") {
  STATIC_REQUIRE_FALSE(std::is_default_constructible_v<SGDOptions>);
  const SGDOptions o = SGDOptions(0.5).momentum(0.9).dampening(0.1).weight_decay(0.2).maximize(true);
  const Hyperparams h = o.to_hyperparams();
  CHECK(h == Hyperparams{{"lr", 0.5}, {"momentum", 0.9}, {"dampening", 0.1}, {"weight_decay", 0.2},
                         {"nesterov", false}, {"maximize", true}});
  SGDOptions back(1.0);
  back.set_hyperparams(h);
  CHECK(back.to_hyperparams() == h);
  CHECK_THROWS_AS(back.set_hyperparams({{"betas", std::vector<double>{0.9, 0.99}}}), ValueError);
  CHECK_THROWS_AS(back.set_hyperparams({{"nesterov", 1.0}}), TypeError);

  Tensor p = Tensor::zeros({3});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(SGD({p}, SGDOptions(-0.1)), Contains("Invalid learning rate"));
  CHECK_THROWS_AS(SGD({p}, SGDOptions(-0.1)), ValueError);
  CHECK_THROWS_WITH(SGD({p}, SGDOptions(0.1).momentum(-0.5)), Contains("Invalid momentum value"));
  CHECK_THROWS_WITH(SGD({p}, SGDOptions(0.1).weight_decay(-1)), Contains("Invalid weight_decay value"));
  CHECK_THROWS_WITH(SGD({p}, SGDOptions(0.1).nesterov(true)),
                    Contains("Nesterov momentum requires a momentum and zero dampening"));
  CHECK_THROWS_WITH(SGD({p}, SGDOptions(0.1).nesterov(true).momentum(0.9).dampening(0.1)),
                    Contains("Nesterov momentum requires a momentum and zero dampening"));
  CHECK_THROWS_AS(SGD({p}, SGDOptions(0.1).nesterov(true)), ValueError);
  CHECK_THROWS_WITH(SGD({p}, SGDOptions(0.1).nesterov(true)), Contains("SGD"));
  // A group's own invalid options are rejected too.
  SGD opt({p}, SGDOptions(0.1));
  CHECK_THROWS_AS(opt.add_param_group(OptimizerParamGroup({Tensor::zeros({2})}, SGDOptions(-1.0))), ValueError);
  CHECK(opt.param_groups().size() == 1);
}

TEST_CASE("SGD keeps the Optimizer base contract", "[optA][sgd]") {
  check_optimizer_contract<SGD>(SGDOptions(0.1).momentum(0.9).weight_decay(0.01),
                                            SGDOptions(0.5).momentum(0.1), false);
}

TEST_CASE("SGD momentum enabled later starts a buffer from a copy", "[optA][sgd]") {
  const auto init = values<float>(kRefNumel, 5);
  Tensor p = tensor_of(init);
  SGD opt({p}, SGDOptions(0.1));
  auto ref = ref_of<float>(SGDOptions(0.1));
  std::vector<float> ref_p = init;
  compare_steps(opt, p, ref_p, 2, ref);
  CHECK(opt.state().at(p.key()).empty());
  opt.param_groups()[0].options_as<SGDOptions>().momentum(0.9);
  ref.momentum = 0.9;
  compare_steps(opt, p, ref_p, 3, ref);
  DOPT_REQUIRE_BITWISE(opt.state().at(p.key()).at("momentum_buffer"), ref.buf);
}
