#include <catch2/catch.hpp>

#include <cmath>

#include "dopt/optim/adagrad.hpp"
#include "optimizer_tests.hpp"

namespace {

// Independent scalar transcription of spec section 3.5 (torch 1.13 Adagrad, dense).
template <class T>
struct RefAdagrad {
  double lr, lr_decay, wd, iav, eps;
  bool maximize;
  float step = 0;  // torch's float32 step tensor
  std::vector<T> sum;
  void operator()(std::vector<T>& p, const std::vector<T>& g) {
    if (sum.empty()) sum.assign(p.size(), T(iav));
    step = step + 1.0f;
    const double s = step;
    const double clr = lr / (1 + (s - 1) * lr_decay);
    for (std::size_t i = 0; i < p.size(); ++i) {
      T gi = maximize ? -g[i] : g[i];
      if (wd != 0) gi = std::fma(T(wd), p[i], gi);
      sum[i] = std::fma(gi, gi, sum[i]);
      const T std_i = std::sqrt(sum[i]) + T(eps);
      p[i] = p[i] + (T(-clr) * gi) / std_i;
    }
  }
};

template <class T>
RefAdagrad<T> ref_of(const AdagradOptions& o) {
  return RefAdagrad<T>{o.lr(), o.lr_decay(), o.weight_decay(), o.initial_accumulator_value(), o.eps(), o.maximize(),
                       0.0f, {}};
}

}  // namespace

TEMPLATE_TEST_CASE("Adagrad matches the spec's operation order bit for bit", "[optA][adagrad]", float, double) {
  using T = TestType;
  const std::vector<std::pair<const char*, AdagradOptions>> cases = {
      {"default", AdagradOptions()},
      {"lr", AdagradOptions(0.1)},
      {"lr_decay", AdagradOptions(0.1).lr_decay(0.3)},
      {"weight_decay", AdagradOptions(0.05).weight_decay(0.2)},
      {"initial_accumulator_value", AdagradOptions(0.05).initial_accumulator_value(0.7)},
      {"eps", AdagradOptions(0.05).eps(1e-2)},
      {"maximize", AdagradOptions(0.05).maximize(true)},
      {"all", AdagradOptions(0.2).lr_decay(0.01).weight_decay(0.1).initial_accumulator_value(0.1).maximize(true)},
  };
  match_reference<Adagrad, T>(cases, 6, ref_of<T>, [](const auto& st, const auto& ref, const auto&) {
    CHECK(st.size() == 2);
    CHECK(st.at("step").item() == 6.0);
    DOPT_REQUIRE_BITWISE(st.at("sum"), ref.sum);
  });
}

TEST_CASE("Adagrad creates state for every parameter when its group is added", "[optA][adagrad]") {
  Tensor a = Tensor::zeros({4}), b = Tensor::zeros({2, 3}, DType::float64), c = Tensor::zeros({5});
  Adagrad opt(std::vector<OptimizerParamGroup>{OptimizerParamGroup({a}),
                                               OptimizerParamGroup({b}, AdagradOptions().initial_accumulator_value(0.5))},
              AdagradOptions().initial_accumulator_value(0.25));
  REQUIRE(opt.state().size() == 2);
  const ParamState& sa = opt.state().at(a.key());
  CHECK(sa.at("step").dtype() == DType::float32);
  CHECK(sa.at("step").dim() == 0);
  CHECK(sa.at("step").item() == 0.0);
  CHECK(sa.at("sum").equal(Tensor::full({4}, 0.25)));
  const ParamState& sb = opt.state().at(b.key());
  // torch 1.13 reads initial_accumulator_value from the constructor, not from the group.
  CHECK(sb.at("sum").equal(Tensor::full({2, 3}, 0.25, DType::float64)));
  CHECK(sb.at("step").dtype() == DType::float32);

  // A group added later gets its state at once (torch 1.13 would give it none).
  opt.add_param_group(OptimizerParamGroup({c}, AdagradOptions().initial_accumulator_value(2.0)));
  CHECK(opt.state().at(c.key()).at("sum").equal(Tensor::full({5}, 0.25)));
  CHECK(opt.state().at(c.key()).at("step").item() == 0.0);

  // The state is in the state dict before any step (as torch's).
  const StateDict sd = opt.state_dict();
  CHECK(sd.state.size() == 3);
}

TEST_CASE("Adagrad options: defaults, torch names, validation", "[optA][adagrad]") {
  const AdagradOptions d;
  CHECK(d.lr() == 1e-2);
  CHECK(d.eps() == 1e-10);
  const Hyperparams h = d.to_hyperparams();
  CHECK(h == Hyperparams{{"lr", 1e-2}, {"lr_decay", 0.0}, {"weight_decay", 0.0},
                         {"initial_accumulator_value", 0.0}, {"eps", 1e-10}, {"maximize", false}});
  AdagradOptions back(0.5);
  back.set_hyperparams(h);
  CHECK(back.to_hyperparams() == h);
  CHECK_THROWS_AS(back.set_hyperparams({{"alpha", 0.9}}), ValueError);
  CHECK_THROWS_AS(back.set_hyperparams({{"lr_decay", std::string("x")}}), TypeError);

  Tensor p = Tensor::zeros({3});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(Adagrad({p}, AdagradOptions(-0.1)), Contains("Invalid learning rate"));
  CHECK_THROWS_WITH(Adagrad({p}, AdagradOptions().lr_decay(-0.1)), Contains("Invalid lr_decay value"));
  CHECK_THROWS_WITH(Adagrad({p}, AdagradOptions().weight_decay(-0.1)), Contains("Invalid weight_decay value"));
  CHECK_THROWS_WITH(Adagrad({p}, AdagradOptions().initial_accumulator_value(-0.1)),
                    Contains("Invalid initial_accumulator_value value"));
  CHECK_THROWS_WITH(Adagrad({p}, AdagradOptions().eps(-0.1)), Contains("Invalid epsilon value"));
  CHECK_THROWS_AS(Adagrad({p}, AdagradOptions().eps(-0.1)), ValueError);
  CHECK_THROWS_WITH(Adagrad({p}, AdagradOptions().eps(-0.1)), Contains("Adagrad"));
}

TEST_CASE("Adagrad keeps the Optimizer base contract", "[optA][adagrad]") {
  check_optimizer_contract<Adagrad>(AdagradOptions(0.1).lr_decay(0.1).initial_accumulator_value(0.2),
                                                AdagradOptions(0.5), true);
}

TEST_CASE("Adagrad re-creates missing state after loading a dict without it", "[optA][adagrad]") {
  const auto init = values<float>(kRefNumel, 7);
  Tensor p = tensor_of(init);
  Adagrad opt({p}, AdagradOptions(0.1).initial_accumulator_value(0.3));
  StateDict sd = opt.state_dict();
  sd.state.clear();
  opt.load_state_dict(sd);
  CHECK(opt.state().empty());
  auto ref = ref_of<float>(AdagradOptions(0.1).initial_accumulator_value(0.3));
  std::vector<float> ref_p = init;
  compare_steps(opt, p, ref_p, 2, ref);
}
