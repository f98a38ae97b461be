#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "dopt/optim/adam.hpp"
#include "dopt/runtime/state_dict.hpp"

#include <cstdio>
#include <cstring>

using namespace dopt;
using namespace dopt::optim;

namespace {

std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Independent scalar transcription of spec section 3.3 (torch 1.13 Adam, single tensor).
struct RefAdam {
  double lr, b1, b2, eps, wd;
  bool amsgrad, maximize;
  std::vector<float> m, v, vmax;
  float step = 0;
  void apply(std::vector<float>& p, const std::vector<float>& g) {
    if (m.empty()) m.assign(p.size(), 0.f), v.assign(p.size(), 0.f), vmax.assign(p.size(), 0.f);
    step = step + 1.0f;
    const double s = step;
    const double bc1 = 1 - std::pow(b1, s), bc2 = 1 - std::pow(b2, s);
    const float neg_ss = float(-(lr / bc1)), bc2s = float(std::sqrt(bc2));
    for (std::size_t i = 0; i < p.size(); ++i) {
      float gi = maximize ? -g[i] : g[i];
      if (wd != 0) gi = std::fma(float(wd), p[i], gi);
      m[i] = std::fma(float(1 - b1), gi, m[i] * float(b1));
      v[i] = std::fma(float(1 - b2) * gi, gi, v[i] * float(b2));
      float base = v[i];
      if (amsgrad) base = vmax[i] = std::max(vmax[i], v[i]);
      float denom = std::sqrt(base) / bc2s + float(eps);
      p[i] = p[i] + (neg_ss * m[i]) / denom;
    }
  }
};

// Bitwise equality (distinguishes -0 from +0, and NaN payloads), unlike float ==.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("Adam matches the spec's float32 operation order bit for bit", "[adam]") {
  struct Cfg {
    double lr, wd;
    bool amsgrad, maximize;
  };
  for (Cfg c : {Cfg{1e-3, 0, false, false}, Cfg{1e-2, 0.1, false, false}, Cfg{1e-2, 0, true, false},
                Cfg{5e-3, 0.05, true, true}, Cfg{1e-3, 0, false, true}}) {
    // 37 elements: covers full vector blocks and the scalar tail of every clone.
    auto init = randn(37, 1);
    Tensor p = Tensor::from_vector(init);
    Adam opt({p}, AdamOptions(c.lr).betas({0.8, 0.99}).eps(1e-6).weight_decay(c.wd).amsgrad(c.amsgrad).maximize(c.maximize));
    RefAdam ref{c.lr, 0.8, 0.99, 1e-6, c.wd, c.amsgrad, c.maximize, {}, {}, {}};
    std::vector<float> rp = init;
    for (int t = 0; t < 25; ++t) {
      auto g = randn(37, 100 + t);
      p.set_grad(Tensor::from_vector(g));
      opt.step();
      ref.apply(rp, g);
      REQUIRE(same_bits(p.to_vector<float>(), rp));
    }
    const auto& st = opt.state().at(p.key());
    CHECK(st.at("step").item() == 25.0);
    CHECK(same_bits(st.at("exp_avg").to_vector<float>(), ref.m));
    CHECK(same_bits(st.at("exp_avg_sq").to_vector<float>(), ref.v));
    CHECK(st.count("max_exp_avg_sq") == (c.amsgrad ? 1u : 0u));
  }
}

TEST_CASE("Adam float64 parameters use double arithmetic", "[adam]") {
  Tensor p = Tensor::from_vector<double>({1.0, -2.0, 0.5});
  p.set_grad(Tensor::from_vector<double>({0.1, 0.2, -0.3}));
  Adam opt({p}, AdamOptions(0.1));
  opt.step();
  // First step: m_hat = g, v_hat = g^2, so p -= lr * g / (|g| + eps), in double.
  const double eps = 1e-8;
  CHECK(p.at(0) == Approx(1.0 - 0.1 * 0.1 / (0.1 + eps)).epsilon(1e-15));
  CHECK(p.at(2) == Approx(0.5 + 0.1 * 0.3 / (0.3 + eps)).epsilon(1e-15));
  CHECK(opt.state().at(p.key()).at("exp_avg").dtype() == DType::float64);
}

TEST_CASE("Adam's float32 step counter saturates at 2^24 like torch", "[adam]") {
  Tensor p = Tensor::from_vector<float>({1.f});
  p.set_grad(Tensor::from_vector<float>({1.f}));
  Adam opt({p});
  opt.step();
  opt.state().at(p.key()).at("step").fill_(16777216.0);
  opt.step();
  CHECK(opt.state().at(p.key()).at("step").item() == 16777216.0);
}

TEST_CASE("Adam validates its hyperparameters", "[adam]") {
  Tensor p = Tensor::zeros({2});
  CHECK_THROWS_WITH(Adam({p}, AdamOptions(-1)), Catch::Contains("Invalid learning rate"));
  CHECK_THROWS_AS(Adam({p}, AdamOptions().eps(-1)), ValueError);
  CHECK_THROWS_WITH(Adam({p}, AdamOptions().betas({1.0, 0.9})), Catch::Contains("beta parameter at index 0"));
  CHECK_THROWS_WITH(Adam({p}, AdamOptions().betas({0.9, -0.1})), Catch::Contains("beta parameter at index 1"));
  CHECK_THROWS_AS(Adam({p}, AdamOptions().weight_decay(-1)), ValueError);
  CHECK_THROWS_WITH(Adam(std::vector<Tensor>{}), Catch::Contains("empty parameter list"));
  CHECK_THROWS_WITH(Adam(std::vector<OptimizerParamGroup>{{{p}}, {{p}}}),
                    Catch::Contains("more than one parameter group"));
  CHECK_THROWS_AS(Adam({Tensor::zeros({2}, DType::int64)}), TypeError);
  // A group with its own invalid options.
  CHECK_THROWS_AS(Adam(std::vector<OptimizerParamGroup>{OptimizerParamGroup({p}, AdamOptions(-0.5))}), ValueError);
}

TEST_CASE("Adam skips parameters without a gradient and checks gradient shape", "[adam]") {
  Tensor a = Tensor::from_vector<float>({1, 2});
  Tensor b = Tensor::from_vector<float>({3, 4});
  Adam opt({a, b});
  a.set_grad(Tensor::from_vector<float>({1, 1}));
  opt.step();
  CHECK(b.to_vector<float>() == std::vector<float>{3, 4});
  CHECK(opt.state().count(b.key()) == 0);
  CHECK(opt.state().count(a.key()) == 1);
  // zero_grad keeps a zeroed gradient by default (torch 1.13), or drops it.
  opt.zero_grad();
  REQUIRE(a.grad().defined());
  CHECK(a.grad().to_vector<float>() == std::vector<float>{0, 0});
  opt.zero_grad(true);
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("Adam per-group options, add_param_group and closures", "[adam]") {
  Tensor a = Tensor::from_vector<float>({1});
  Tensor b = Tensor::from_vector<float>({1});
  Adam opt(std::vector<OptimizerParamGroup>{OptimizerParamGroup({a}, AdamOptions(0.1))}, AdamOptions(0.01));
  opt.add_param_group(OptimizerParamGroup({b}));
  CHECK(opt.param_groups().size() == 2);
  CHECK(opt.param_groups()[0].options->get_lr() == 0.1);
  CHECK(opt.param_groups()[1].options->get_lr() == 0.01);  // filled from defaults
  CHECK_THROWS_AS(opt.add_param_group(OptimizerParamGroup({a})), ValueError);
  a.set_grad(Tensor::from_vector<float>({1}));
  b.set_grad(Tensor::from_vector<float>({1}));
  int calls = 0;
  auto loss = opt.step([&] {
    ++calls;
    return 3.5;
  });
  CHECK(calls == 1);
  REQUIRE(loss.has_value());
  CHECK(*loss == 3.5);
  // First Adam step moves by ~lr against the gradient.
  CHECK(a.at(0) == Approx(0.9).epsilon(1e-6));
  CHECK(b.at(0) == Approx(0.99).epsilon(1e-6));
}

TEST_CASE("Adam state_dict round trip continues identically", "[adam]") {
  auto init = randn(50, 3);
  Tensor p1 = Tensor::from_vector(init);
  Adam full({p1}, AdamOptions(1e-2).amsgrad(true));
  Tensor p2 = Tensor::from_vector(init);
  Adam first({p2}, AdamOptions(1e-2).amsgrad(true));
  for (int t = 0; t < 10; ++t) {
    auto g = Tensor::from_vector(randn(50, 200 + t));
    p1.set_grad(g);
    full.step();
    if (t < 5) {
      p2.set_grad(g.clone());
      first.step();
    }
    if (t == 4) {
      StateDict sd = first.state_dict();
      REQUIRE(sd.param_groups.size() == 1);
      CHECK(sd.param_groups[0].params == std::vector<std::int64_t>{0});
      CHECK(std::get<bool>(sd.param_groups[0].hyperparams.at("amsgrad")));
      // Resume in a fresh optimizer over a copy of the parameters.
      // ... through a checkpoint file, as a trainer would.
      const std::string path = "adam_resume_test.safetensors";
      dopt::save_state_dict(sd, path);
      Tensor p3 = p2.clone();
      Adam resumed({p3}, AdamOptions(0.5));  // hyperparameters come from the dict
      resumed.load_state_dict(dopt::load_state_dict(path));
      std::remove(path.c_str());
      CHECK(resumed.param_groups()[0].options->get_lr() == 1e-2);
      for (int u = 5; u < 10; ++u) {
        p3.set_grad(Tensor::from_vector(randn(50, 200 + u)));
        resumed.step();
      }
      p2 = p3;
    }
  }
  CHECK(p1.equal(p2));
}

TEST_CASE("Adam load_state_dict rejects mismatched dicts and leaves the optimizer unchanged", "[adam]") {
  Tensor a = Tensor::zeros({3}), b = Tensor::zeros({2});
  Adam opt({a, b});
  a.set_grad(Tensor::full({3}, 1.0));
  opt.step();
  StateDict sd = opt.state_dict();

  StateDict two_groups = sd;
  two_groups.param_groups.push_back(two_groups.param_groups[0]);
  CHECK_THROWS_WITH(opt.load_state_dict(two_groups), Catch::Contains("different number of parameter groups"));

  StateDict short_group = sd;
  short_group.param_groups[0].params.pop_back();
  CHECK_THROWS_WITH(opt.load_state_dict(short_group), Catch::Contains("doesn't match the size"));

  StateDict bad_shape = sd;
  bad_shape.state[0]["exp_avg"] = Tensor::zeros({4});
  CHECK_THROWS_AS(opt.load_state_dict(bad_shape), StateDictError);

  StateDict bad_key = sd;
  bad_key.param_groups[0].hyperparams["momentum"] = 0.9;
  CHECK_THROWS_AS(opt.load_state_dict(bad_key), ValueError);
  CHECK(opt.state().at(a.key()).at("step").item() == 1.0);

  // State tensors are cast to the parameter's dtype; step is kept as saved.
  StateDict f64 = sd;
  f64.state[0]["exp_avg"] = f64.state[0]["exp_avg"].to(DType::float64);
  opt.load_state_dict(f64);
  CHECK(opt.state().at(a.key()).at("exp_avg").dtype() == DType::float32);
}
