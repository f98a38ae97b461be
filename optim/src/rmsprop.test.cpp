#include <catch2/catch.hpp>

#include <cmath>

#include "dopt/optim/rmsprop.hpp"
#include "optimizer_tests.hpp"

namespace {

// Independent scalar transcription of spec section 3.6 (torch 1.13 RMSprop).
template <class T>
struct RefRMSprop {
  double lr, alpha, eps, wd, momentum;
  bool centered, maximize;
  std::vector<T> sq, ga, buf;
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    if (sq.empty()) sq.assign(p.size(), T(0)), ga.assign(p.size(), T(0)), buf.assign(p.size(), T(0));
    for (std::size_t i = 0; i < p.size(); ++i) {
      T gi = maximize ? -g[i] : g[i];
      if (wd != 0) gi = std::fma(T(wd), p[i], gi);
      sq[i] = std::fma(T(T(1 - alpha) * gi), gi, sq[i] * T(alpha));
      T avg;
      if (centered) {
        ga[i] = std::fma(T(1 - alpha), gi, ga[i] * T(alpha));
        avg = std::sqrt(std::fma(-ga[i], ga[i], sq[i]));
      } else {
        avg = std::sqrt(sq[i]);
      }
      avg = avg + T(eps);
      if (momentum > 0) {
        buf[i] = buf[i] * T(momentum) + gi / avg;
        p[i] = std::fma(T(-lr), buf[i], p[i]);
      } else {
        p[i] = p[i] + (T(-lr) * gi) / avg;
      }
    }
  }
};

template <class T>
RefRMSprop<T> ref_of(const RMSpropOptions& o) {
  return RefRMSprop<T>{o.lr(), o.alpha(), o.eps(), o.weight_decay(), o.momentum(), o.centered(), o.maximize(),
                       {}, {}, {}};
}

}  // namespace

TEMPLATE_TEST_CASE("RMSprop matches the spec's operation order bit for bit", "[optA][rmsprop]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, RMSpropOptions>> cases = {
      {"default", RMSpropOptions()},
      {"alpha+eps", RMSpropOptions(0.02).alpha(0.9).eps(1e-3)},
      {"weight_decay", RMSpropOptions(0.01).weight_decay(0.2)},
      {"momentum", RMSpropOptions(0.01).momentum(0.9)},
      {"centered", RMSpropOptions(0.01).centered(true)},
      {"centered+momentum", RMSpropOptions(0.01).centered(true).momentum(0.5)},
      // small alpha: grad_avg^2 is a large part of square_avg, so the FMA in the centered variance shows
      {"centered, alpha 0.3", RMSpropOptions(0.01).centered(true).alpha(0.3)},
      {"maximize", RMSpropOptions(0.01).maximize(true)},
      {"all", RMSpropOptions(0.03).alpha(0.95).weight_decay(0.1).momentum(0.8).centered(true).maximize(true)},
  };
  match_reference<RMSprop, T>(cases, 6, ref_of<T>, [](const auto& st, const auto& ref, const auto& o) {
    CHECK(st.size() == 2u + (o.momentum() > 0) + o.centered());
    check_step_counter(st.at("step"), DType::int64, 6.0);
    DOPT_REQUIRE_BITWISE(st.at("square_avg"), ref.sq);
    if (o.centered()) DOPT_REQUIRE_BITWISE(st.at("grad_avg"), ref.ga);
    else CHECK(st.count("grad_avg") == 0);
    if (o.momentum() > 0) DOPT_REQUIRE_BITWISE(st.at("momentum_buffer"), ref.buf);
    else CHECK(st.count("momentum_buffer") == 0);
  });
}

TEST_CASE("RMSprop momentum or centered enabled after state creation is a StateError", "[optA][rmsprop]") {
  Tensor p = tensor_of(values<float>(8, 1));
  RMSprop opt({p}, RMSpropOptions());
  p.set_grad(tensor_of(values<float>(8, 2)));
  opt.step();
  const Tensor before = p.clone();
  auto& o = opt.param_groups()[0].options_as<RMSpropOptions>();
  using Catch::Matchers::Contains;
  SECTION("momentum") {
    o.momentum(0.9);
    CHECK_THROWS_AS(opt.step(), StateError);
    CHECK_THROWS_WITH(opt.step(), Contains("momentum") && Contains("RMSprop.step"));
  }
  SECTION("centered") {
    o.centered(true);
    CHECK_THROWS_AS(opt.step(), StateError);
    CHECK_THROWS_WITH(opt.step(), Contains("centered"));
  }
  CHECK(p.equal(before));
  CHECK(opt.state().at(p.key()).at("step").item() == 1.0);  // not advanced by the failed steps
}

TEST_CASE("RMSprop options: defaults, torch names, validation", "[optA][rmsprop]") {
  const RMSpropOptions d;
  CHECK(d.lr() == 1e-2);
  CHECK(d.alpha() == 0.99);
  CHECK(d.eps() == 1e-8);
  const Hyperparams h = d.to_hyperparams();
  CHECK(h == Hyperparams{{"lr", 1e-2}, {"alpha", 0.99}, {"eps", 1e-8}, {"weight_decay", 0.0},
                         {"momentum", 0.0}, {"centered", false}, {"maximize", false}});
  RMSpropOptions back(0.5);
  back.set_hyperparams(h);
  CHECK(back.to_hyperparams() == h);
  CHECK_THROWS_AS(back.set_hyperparams({{"betas", std::vector<double>{0.9, 0.99}}}), ValueError);
  CHECK_THROWS_AS(back.set_hyperparams({{"centered", 1.0}}), TypeError);

  Tensor p = Tensor::zeros({3});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(RMSprop({p}, RMSpropOptions(-0.1)), Contains("Invalid learning rate"));
  CHECK_THROWS_WITH(RMSprop({p}, RMSpropOptions().eps(-0.1)), Contains("Invalid epsilon value"));
  CHECK_THROWS_WITH(RMSprop({p}, RMSpropOptions().momentum(-0.1)), Contains("Invalid momentum value"));
  CHECK_THROWS_WITH(RMSprop({p}, RMSpropOptions().weight_decay(-0.1)), Contains("Invalid weight_decay value"));
  CHECK_THROWS_WITH(RMSprop({p}, RMSpropOptions().alpha(-0.1)), Contains("Invalid alpha value"));
  CHECK_THROWS_AS(RMSprop({p}, RMSpropOptions().alpha(-0.1)), ValueError);
  CHECK_THROWS_WITH(RMSprop({p}, RMSpropOptions().alpha(-0.1)), Contains("RMSprop"));
}

TEST_CASE("RMSprop keeps the Optimizer base contract", "[optA][rmsprop]") {
  check_optimizer_contract<RMSprop>(RMSpropOptions(0.01).momentum(0.9).centered(true),
                                                RMSpropOptions(0.5).momentum(0.5).centered(true), false);
}
