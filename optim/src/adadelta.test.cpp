#include <catch2/catch.hpp>

#include <cmath>

#include "dopt/optim/adadelta.hpp"
#include "optimizer_tests.hpp"

namespace {

// Independent scalar transcription of spec section 3.8 (torch 1.13 Adadelta).
template <class T>
struct RefAdadelta {
  double lr, rho, eps, wd;
  bool maximize;
  std::vector<T> sq, acc;
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    if (sq.empty()) sq.assign(p.size(), T(0)), acc.assign(p.size(), T(0));
    for (std::size_t i = 0; i < p.size(); ++i) {
      T gi = maximize ? -g[i] : g[i];
      if (wd != 0) gi = std::fma(T(wd), p[i], gi);
      sq[i] = sq[i] * T(rho);
      sq[i] = std::fma(T(T(1 - rho) * gi), gi, sq[i]);
      const T sd = std::sqrt(T(sq[i] + T(eps)));
      T delta = std::sqrt(T(acc[i] + T(eps)));
      delta = delta / sd;
      delta = delta * gi;
      acc[i] = acc[i] * T(rho);
      acc[i] = std::fma(T(T(1 - rho) * delta), delta, acc[i]);
      p[i] = std::fma(T(-lr), delta, p[i]);
    }
  }
};

template <class T>
RefAdadelta<T> ref_of(const AdadeltaOptions& o) {
  return RefAdadelta<T>{o.lr(), o.rho(), o.eps(), o.weight_decay(), o.maximize(), {}, {}};
}

}  // namespace

TEMPLATE_TEST_CASE("Adadelta matches the spec's operation order bit for bit", "[optB][adadelta]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, AdadeltaOptions>> cases = {
      {"default", AdadeltaOptions()},
      {"lr+rho+eps", AdadeltaOptions(0.5).rho(0.7).eps(1e-3)},
      {"weight_decay", AdadeltaOptions().weight_decay(0.2)},
      {"maximize", AdadeltaOptions().maximize(true)},
      {"rho 0", AdadeltaOptions(0.1).rho(0.0)},
      {"rho 1", AdadeltaOptions(0.1).rho(1.0)},
      {"all", AdadeltaOptions(2.0).rho(0.95).eps(1e-5).weight_decay(0.05).maximize(true)},
  };
  match_reference<Adadelta, T>(cases, 25, ref_of<T>, [](const auto& st, const auto& ref, const auto&) {
    CHECK(st.size() == 3u);
    check_step_counter(st.at("step"), DType::int64, 25.0);
    DOPT_REQUIRE_BITWISE(st.at("square_avg"), ref.sq);
    DOPT_REQUIRE_BITWISE(st.at("acc_delta"), ref.acc);
  });
}

TEST_CASE("Adadelta test data exposes the FMAs", "[optB][adadelta]") {
  // A variant of the reference with plain multiply-adds must end up elsewhere
  // on this data, so the bitwise comparison above does check the FMAs.
  const AdadeltaOptions o(0.7);
  auto ref = ref_of<float>(o);
  std::vector<float> fused = values<float>(kRefNumel, 7), plain = fused;
  std::vector<float> sq(plain.size(), 0.f), acc(plain.size(), 0.f);
  const float rho = float(o.rho()), omr = float(1 - o.rho()), eps = float(o.eps()), neg_lr = float(-o.lr());
  for (int t = 0; t < 25; ++t) {
    const auto g = values<float>(plain.size(), 1000 + static_cast<std::uint64_t>(t), 2.0);
    ref(fused, g);
    for (std::size_t i = 0; i < plain.size(); ++i) {
      sq[i] = sq[i] * rho + (omr * g[i]) * g[i];
      const float delta = (std::sqrt(acc[i] + eps) / std::sqrt(sq[i] + eps)) * g[i];
      acc[i] = acc[i] * rho + (omr * delta) * delta;
      plain[i] = plain[i] + neg_lr * delta;
    }
  }
  CHECK(fused != plain);
}

TEST_CASE("Adadelta options: defaults, torch names, validation", "[optB][adadelta]") {
  const AdadeltaOptions d;
  CHECK(d.lr() == 1.0);
  CHECK(d.rho() == 0.9);
  CHECK(d.eps() == 1e-6);
  CHECK(d.weight_decay() == 0.0);
  CHECK_FALSE(d.maximize());
  const Hyperparams h = d.to_hyperparams();
  CHECK(h == Hyperparams{{"lr", 1.0}, {"rho", 0.9}, {"eps", 1e-6}, {"weight_decay", 0.0}, {"maximize", false}});
  AdadeltaOptions back(0.5);
  back.rho(0.1).maximize(true);
  back.set_hyperparams(h);
  CHECK(back.to_hyperparams() == h);
  CHECK_THROWS_AS(back.set_hyperparams({{"alpha", 0.9}}), ValueError);
  CHECK_THROWS_WITH(back.set_hyperparams({{"alpha", 0.9}}), Contains("'alpha'"));
  CHECK_THROWS_AS(back.set_hyperparams({{"rho", std::string("0.9")}}), TypeError);

  Tensor p = Tensor::zeros({3});
  CHECK_THROWS_WITH(Adadelta({p}, AdadeltaOptions(-1.0)), Equals("Adadelta: Invalid learning rate: -1.0"));
  CHECK_THROWS_WITH(Adadelta({p}, AdadeltaOptions().rho(1.5)), Equals("Adadelta: Invalid rho value: 1.5"));
  CHECK_THROWS_WITH(Adadelta({p}, AdadeltaOptions().rho(-0.1)), Equals("Adadelta: Invalid rho value: -0.1"));
  CHECK_THROWS_WITH(Adadelta({p}, AdadeltaOptions().eps(-1e-6)), Equals("Adadelta: Invalid epsilon value: -1e-06"));
  CHECK_THROWS_WITH(Adadelta({p}, AdadeltaOptions().weight_decay(-0.25)),
                    Equals("Adadelta: Invalid weight_decay value: -0.25"));
  CHECK_NOTHROW(Adadelta({p}, AdadeltaOptions(0.0).rho(1.0).eps(0.0)));
  CHECK_NOTHROW(Adadelta({p}, AdadeltaOptions().rho(0.0)));
}

TEST_CASE("Adadelta keeps the Optimizer base contract", "[optB][adadelta]") {
  check_optimizer_contract<Adadelta>(AdadeltaOptions(0.5).weight_decay(0.1),
                                                 AdadeltaOptions(2.0).rho(0.5), false);
}
