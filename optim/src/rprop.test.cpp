#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "dopt/optim/rprop.hpp"
#include "optimizer_tests.hpp"

namespace {

template <class T>
T torch_sign(T x) {  // torch.sign on this build: 0 for +-0 and NaN
  if (x > T(0)) return T(1);
  if (x < T(0)) return T(-1);
  return T(0);
}

// Independent scalar transcription of spec section 3.9 (torch 1.13 Rprop).
template <class T>
struct RefRprop {
  double lr, eta_minus, eta_plus, step_min, step_max;
  bool maximize;
  std::vector<T> prev, step_size;
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    if (prev.empty()) prev.assign(p.size(), T(0)), step_size.assign(p.size(), T(lr));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const T gi = maximize ? -g[i] : g[i];
      const T prod = gi * prev[i];
      const T sgn = torch_sign(prod);
      T f = sgn;
      if (f > T(0)) f = T(eta_plus);
      if (f < T(0)) f = T(eta_minus);
      if (f == T(0)) f = T(1);
      step_size[i] = std::min(std::max(T(step_size[i] * f), T(step_min)), T(step_max));
      const T g2 = f == T(eta_minus) ? T(0) : gi;
      p[i] = std::fma(T(-1) * torch_sign(g2), step_size[i], p[i]);
      prev[i] = g2;
    }
  }
};

template <class T>
RefRprop<T> ref_of(const RpropOptions& o) {
  return RefRprop<T>{o.lr(), o.etas()[0], o.etas()[1], o.step_sizes()[0], o.step_sizes()[1], o.maximize(), {}, {}};
}

// Gradient of step t: random signs, with exact zeros in every third element on odd steps.
template <class T>
std::vector<T> grad_of(std::size_t n, int t) {
  auto g = values<T>(n, 500 + static_cast<std::uint64_t>(t), 2.0);
  if (t % 2 == 1)
    for (std::size_t i = 0; i < n; i += 3) g[i] = T(0);
  return g;
}

}  // namespace

TEMPLATE_TEST_CASE("Rprop matches the spec's operation order bit for bit", "[optB][rprop]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, RpropOptions>> cases = {
      {"default", RpropOptions()},
      {"etas", RpropOptions(0.03).etas({0.3, 1.7})},
      // tight bounds: the clamp hits both ends
      {"step_sizes", RpropOptions(0.01).step_sizes({4e-3, 0.0125})},
      {"maximize", RpropOptions(0.02).maximize(true)},
      {"all", RpropOptions(0.05).etas({0.6, 1.1}).step_sizes({1e-2, 0.08}).maximize(true)},
  };
  for (const auto& [name, o] : cases) {
    DYNAMIC_SECTION(name) {
      const auto init = values<T>(kRefNumel, 7);
      Tensor p = tensor_of(init);
      Rprop opt({p}, o);
      auto ref = ref_of<T>(o);
      std::vector<T> ref_p = init;
      bool hit_min = false, hit_max = false;
      for (int t = 0; t < 25; ++t) {
        const auto g = grad_of<T>(init.size(), t);
        p.set_grad(tensor_of(g));
        opt.step();
        ref(ref_p, g);
        INFO("after step " << (t + 1));
        DOPT_REQUIRE_BITWISE(p, ref_p);
        for (T s : ref.step_size) hit_min |= s == T(o.step_sizes()[0]), hit_max |= s == T(o.step_sizes()[1]);
      }
      if (std::string(name) == "step_sizes") {
        INFO("min " << hit_min << " max " << hit_max);
        CHECK((hit_min && hit_max));
      }
      const ParamState& st = opt.state().at(p.key());
      CHECK(st.size() == 3u);
      check_step_counter(st.at("step"), DType::int64, 25.0);
      DOPT_REQUIRE_BITWISE(st.at("prev"), ref.prev);
      DOPT_REQUIRE_BITWISE(st.at("step_size"), ref.step_size);
    }
  }
}

TEST_CASE("Rprop state starts as prev = 0 and step_size = lr", "[optB][rprop]") {
  Tensor p = tensor_of(values<double>(6, 1), {2, 3});
  Rprop opt({p}, RpropOptions(0.125));
  p.set_grad(Tensor::zeros({2, 3}, DType::float64));
  const Tensor before = p.clone();
  opt.step();  // zero gradient: factor 1, no update
  const ParamState& st = opt.state().at(p.key());
  CHECK(st.at("prev").equal(Tensor::zeros({2, 3}, DType::float64)));
  CHECK(st.at("step_size").equal(Tensor::full({2, 3}, 0.125, DType::float64)));
  CHECK(p.equal(before));
}

TEST_CASE("Rprop uses the sign of the float32 product", "[optB][rprop]") {
  // 1e-30 * 1e-30 underflows to 0 in float32 (factor 1) but not in float64 (eta+).
  SECTION("float32") {
    Tensor p = tensor_of(std::vector<float>{1.0f});
    Rprop opt({p}, RpropOptions(0.01));
    for (int t = 0; t < 2; ++t) {
      p.set_grad(tensor_of(std::vector<float>{1e-30f}));
      opt.step();
    }
    CHECK(opt.state().at(p.key()).at("step_size").at(0) == static_cast<double>(0.01f));
  }
  SECTION("float64") {
    Tensor p = tensor_of(std::vector<double>{1.0});
    Rprop opt({p}, RpropOptions(0.01));
    for (int t = 0; t < 2; ++t) {
      p.set_grad(tensor_of(std::vector<double>{1e-30}));
      opt.step();
    }
    CHECK(opt.state().at(p.key()).at("step_size").at(0) == 0.01 * 1.2);
  }
}

TEST_CASE("Rprop: a NaN gradient gives no update but poisons prev", "[optB][rprop]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor p = tensor_of(std::vector<float>{1.0f, 2.0f});
  Rprop opt({p}, RpropOptions(0.01));
  p.set_grad(tensor_of(std::vector<float>{1.0f, 1.0f}));
  opt.step();
  const double p0 = p.at(0), p1 = p.at(1);
  p.set_grad(tensor_of(std::vector<float>{nan, 1.0f}));
  opt.step();
  const ParamState& st = opt.state().at(p.key());
  CHECK(p.at(0) == p0);  // sign(NaN) = 0
  CHECK(p.at(1) < p1);
  CHECK(std::isnan(st.at("prev").at(0)));
  const double ss0 = st.at("step_size").at(0);
  CHECK(ss0 == static_cast<double>(0.01f));  // product NaN: factor 1
  p.set_grad(tensor_of(std::vector<float>{1.0f, 1.0f}));
  opt.step();  // product with NaN prev: factor 1 again, and the update happens
  CHECK(st.at("step_size").at(0) == ss0);
  CHECK(p.at(0) == static_cast<double>(std::fma(-1.0f, static_cast<float>(ss0), static_cast<float>(p0))));
  CHECK(st.at("prev").at(0) == 1.0);
}

TEST_CASE("Rprop options: defaults, torch names, validation", "[optB][rprop]") {
  const RpropOptions d;
  CHECK(d.lr() == 1e-2);
  CHECK(d.etas() == Pair{0.5, 1.2});
  CHECK(d.step_sizes() == Pair{1e-6, 50.0});
  CHECK_FALSE(d.maximize());
  const Hyperparams h = d.to_hyperparams();
  CHECK(h == Hyperparams{{"lr", 1e-2}, {"etas", std::vector<double>{0.5, 1.2}},
                         {"step_sizes", std::vector<double>{1e-6, 50.0}}, {"maximize", false}});
  RpropOptions back(0.5);
  back.etas({0.1, 3.0}).step_sizes({1.0, 2.0}).maximize(true);
  back.set_hyperparams(h);
  CHECK(back.to_hyperparams() == h);
  CHECK_THROWS_AS(back.set_hyperparams({{"weight_decay", 0.0}}), ValueError);
  CHECK_THROWS_WITH(back.set_hyperparams({{"weight_decay", 0.0}}), Contains("'weight_decay'"));
  CHECK_THROWS_AS(back.set_hyperparams({{"etas", std::vector<double>{0.5}}}), TypeError);

  Tensor p = Tensor::zeros({3});
  CHECK_THROWS_WITH(Rprop({p}, RpropOptions(-0.01)), Equals("Rprop: Invalid learning rate: -0.01"));
  CHECK_THROWS_WITH(Rprop({p}, RpropOptions().etas({1.5, 1.2})), Equals("Rprop: Invalid eta values: 1.5, 1.2"));
  CHECK_THROWS_WITH(Rprop({p}, RpropOptions().etas({0.0, 1.2})), Equals("Rprop: Invalid eta values: 0.0, 1.2"));
  CHECK_THROWS_WITH(Rprop({p}, RpropOptions().etas({0.5, 1.0})), Equals("Rprop: Invalid eta values: 0.5, 1.0"));
  CHECK_THROWS_AS(Rprop({p}, RpropOptions().etas({0.5, 0.9})), ValueError);
  // torch does not check step_sizes
  CHECK_NOTHROW(Rprop({p}, RpropOptions().step_sizes({1.0, 0.5})));
}

TEST_CASE("Rprop keeps the Optimizer base contract", "[optB][rprop]") {
  check_optimizer_contract<Rprop>(RpropOptions(0.01).etas({0.4, 1.3}),
                                              RpropOptions(0.5).step_sizes({1e-3, 1.0}), false);
}
