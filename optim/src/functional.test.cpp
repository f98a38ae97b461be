#include <catch2/catch.hpp>

#include <cmath>
#include <memory>

#include "dopt/optim/functional.hpp"
#include "optimizer_tests.hpp"

namespace {

std::vector<Tensor> make_params(std::uint64_t seed) {
  return {tensor_of(values<float>(kRefNumel, seed)), tensor_of(values<float>(6, seed + 1), {2, 3}),
          tensor_of(values<float>(5, seed + 2))};
}

std::vector<Tensor> clones(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const auto& p : ps) out.push_back(p.clone());
  return out;
}

// Gradients of step t; some are None (undefined), including in the middle of the list.
std::vector<Tensor> grads_of(const std::vector<Tensor>& ps, int t) {
  std::vector<Tensor> gs;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const bool none = (i == 1 && t % 2 == 0) || (i == 0 && t == 3) || (i == 2 && t < 2);
    gs.push_back(none ? Tensor()
                      : tensor_of(values<float>(static_cast<std::size_t>(ps[i].numel()), 100 * t + i, 2.0),
                                  ps[i].shape()));
  }
  return gs;
}

template <class StateA, class StateB>
void require_same_state_maps(const StateA& a, const std::vector<Tensor>& pa, const StateB& b,
                             const std::vector<Tensor>& pb) {
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO("param " << i);
    auto ia = a.find(pa[i].key());
    auto ib = b.find(pb[i].key());
    REQUIRE((ia == a.end()) == (ib == b.end()));
    if (ia != a.end()) require_same_state(ia->second, ib->second);
  }
}

/// The class Opt and its functional form F, fed the same gradients (with
/// Nones), give bitwise the same parameters and state after every step.
template <class Opt, class F>
void check_functional_matches_class(const typename Opt::Options& o) {
  std::vector<Tensor> pc = make_params(1), pf = clones(pc);
  Opt cls(pc, o);
  F fn(pf, o);
  require_same_state_maps(cls.state(), pc, fn.state(), pf);
  for (int t = 0; t < 8; ++t) {
    const auto gs = grads_of(pc, t);
    for (std::size_t i = 0; i < pc.size(); ++i) pc[i].set_grad(gs[i]);
    cls.step();
    fn.step(gs);
    INFO("after step " << (t + 1));
    for (std::size_t i = 0; i < pc.size(); ++i) {
      INFO("param " << i);
      REQUIRE(pc[i].equal(pf[i]));
    }
    require_same_state_maps(cls.state(), pc, fn.state(), pf);
  }
  // Every parameter moved (each had some gradients) and has its state.
  const auto init = make_params(1);
  for (std::size_t i = 0; i < pf.size(); ++i) CHECK_FALSE(pf[i].equal(init[i]));
  // step_param on a third copy gives the same again.
  std::vector<Tensor> pp = make_params(1);
  F by_param(pp, o);
  for (int t = 0; t < 8; ++t) {
    const auto gs = grads_of(pp, t);
    for (std::size_t i = 0; i < pp.size(); ++i) by_param.step_param(pp[i], gs[i]);
  }
  for (std::size_t i = 0; i < pp.size(); ++i) REQUIRE(pp[i].equal(pf[i]));
  require_same_state_maps(by_param.state(), pp, fn.state(), pf);
}

}  // namespace

TEST_CASE("Functional optimizers match their classes bit for bit, None grads included", "[optB][functional]") {
  SECTION("SGD") {
    check_functional_matches_class<SGD, FunctionalSGD>(SGDOptions(0.05).momentum(0.9).weight_decay(0.1).nesterov(true));
  }
  SECTION("SGD without momentum") { check_functional_matches_class<SGD, FunctionalSGD>(SGDOptions(0.05)); }
  SECTION("Adam") {
    check_functional_matches_class<Adam, FunctionalAdam>(AdamOptions(0.01).weight_decay(0.1).amsgrad(true));
  }
  SECTION("AdamW") {
    check_functional_matches_class<AdamW, FunctionalAdamW>(AdamWOptions(0.01).amsgrad(true).maximize(true));
  }
  SECTION("Adagrad") {
    check_functional_matches_class<Adagrad, FunctionalAdagrad>(
        AdagradOptions(0.05).lr_decay(0.01).initial_accumulator_value(0.1).weight_decay(0.05));
  }
  SECTION("RMSprop") {
    check_functional_matches_class<RMSprop, FunctionalRMSprop>(
        RMSpropOptions(0.01).momentum(0.5).centered(true).weight_decay(0.1));
  }
  SECTION("Adamax") {
    check_functional_matches_class<Adamax, FunctionalAdamax>(AdamaxOptions(0.01).weight_decay(0.1));
  }
  SECTION("Adadelta") {
    check_functional_matches_class<Adadelta, FunctionalAdadelta>(AdadeltaOptions(0.5).rho(0.8).maximize(true));
  }
  SECTION("Rprop") {
    check_functional_matches_class<Rprop, FunctionalRprop>(RpropOptions(0.02).etas({0.4, 1.3}));
  }
}

TEST_CASE("Functional step checks the gradient list", "[optB][functional]") {
  std::vector<Tensor> ps = make_params(3);
  FunctionalAdam fn(ps);
  SECTION("length mismatch has torch's text") {
    CHECK_THROWS_AS(fn.step({Tensor()}), ValueError);
    CHECK_THROWS_WITH(fn.step({Tensor()}),
                      Equals("FunctionalAdam.step: the gradients passed in does not equal to the size of the "
                             "parameters!Params length: 3. Gradients length: 1"));
  }
  SECTION("a gradient that does not fit is an error before any update") {
    const auto before = clones(ps);
    std::vector<Tensor> gs = grads_of(ps, 1);
    gs[2] = Tensor::zeros({4});
    CHECK_THROWS_AS(fn.step(gs), ShapeError);
    gs[2] = Tensor::zeros({5}, DType::float64);
    CHECK_THROWS_AS(fn.step(gs), DTypeError);
    for (std::size_t i = 0; i < ps.size(); ++i) CHECK(ps[i].equal(before[i]));
    CHECK(fn.state().empty());
  }
  SECTION("all None: nothing happens") {
    const auto before = clones(ps);
    fn.step({Tensor(), Tensor(), Tensor()});
    for (std::size_t i = 0; i < ps.size(); ++i) CHECK(ps[i].equal(before[i]));
    CHECK(fn.state().empty());
  }
  SECTION("it never touches param.grad()") {
    const Tensor g = tensor_of(values<float>(5, 9));
    ps[2].set_grad(g);
    const Tensor g_before = g.clone();
    fn.step({Tensor(), Tensor(), Tensor()});
    CHECK(fn.state_of(ps[2]) == nullptr);
    CHECK(ps[2].grad().equal(g_before));
  }
}

TEST_CASE("Functional constructors: empty lists, bad params, validation", "[optB][functional]") {
  CHECK_THROWS_WITH(FunctionalAdam({}), Equals("FunctionalAdam: optimizer got an empty parameter list"));
  CHECK_THROWS_AS(FunctionalSGD({}, SGDOptions(0.1)), ValueError);
  CHECK(FunctionalAdam({}, AdamOptions(), true).params().empty());
  CHECK(FunctionalAdagrad({}, AdagradOptions(), true).state().empty());
  Tensor p = Tensor::zeros({3});
  CHECK_THROWS_AS(FunctionalAdam({p, Tensor()}), TypeError);
  CHECK_THROWS_AS(FunctionalAdam({Tensor::zeros({3}, DType::int64)}), TypeError);
  CHECK_THROWS_AS(FunctionalAdam({p, p}), ValueError);
  // dopt validates as the torch.optim class does (torch's functional SGD,
  // Adagrad, Adadelta, RMSprop and Rprop do not validate).
  CHECK_THROWS_WITH(FunctionalSGD({p}, SGDOptions(0.1).nesterov(true)),
                    Equals("FunctionalSGD: Nesterov momentum requires a momentum and zero dampening"));
  CHECK_THROWS_WITH(FunctionalRprop({p}, RpropOptions().etas({1.5, 2.0})),
                    Equals("FunctionalRprop: Invalid eta values: 1.5, 2.0"));
  CHECK_THROWS_AS(FunctionalAdadelta({p}, AdadeltaOptions().rho(2.0)), ValueError);
  CHECK_THROWS_AS(FunctionalAdagrad({p}, AdagradOptions(-1.0)), ValueError);
  CHECK_THROWS_AS(FunctionalRMSprop({p}, RMSpropOptions().alpha(-1.0)), ValueError);
  CHECK_THROWS_AS(FunctionalAdamax({p}, AdamaxOptions().betas({1.0, 0.9})), ValueError);
  CHECK_THROWS_AS(FunctionalAdamW({p}, AdamWOptions().eps(-1.0)), ValueError);
}

TEST_CASE("Functional names, defaults and set_lr", "[optB][functional]") {
  Tensor p = tensor_of(values<float>(8, 1));
  FunctionalAdamax fn({p});
  CHECK(fn.name() == "FunctionalAdamax");
  CHECK(fn.optimizer_name() == "Adamax");
  // torch.optim.Adamax's default (torch's functional form has 1e-3).
  CHECK(fn.lr() == 2e-3);
  CHECK(fn.defaults() == AdamaxOptions().to_hyperparams());
  fn.set_lr(0.5);
  CHECK(fn.lr() == 0.5);
  CHECK(std::get<double>(fn.defaults().at("lr")) == 0.5);
  CHECK_THROWS_AS(fn.set_lr(-1.0), ValueError);
  CHECK(fn.lr() == 0.5);
  fn.set_defaults({{"eps", 1e-3}});
  CHECK(fn.options().eps() == 1e-3);
  CHECK_THROWS_AS(fn.set_defaults({{"momentum", 0.9}}), ValueError);
  CHECK_THROWS_AS(fn.set_defaults({{"eps", 1e-2}, {"betas", std::vector<double>{2.0, 0.5}}}), ValueError);
  CHECK(fn.options().eps() == 1e-3);  // a failed set_defaults changes nothing
  // The new lr is what the next step uses.
  Tensor q = p.clone();
  Adamax cls({q}, AdamaxOptions(0.5).eps(1e-3));
  const Tensor g = tensor_of(values<float>(8, 2));
  q.set_grad(g);
  cls.step();
  fn.step({g});
  CHECK(p.equal(q));
}

TEST_CASE("Functional forms fix torch 1.13's functional bugs", "[optB][functional]") {
  SECTION("Adagrad with a None gradient updates the right parameter") {
    std::vector<Tensor> ps = make_params(5), ref = clones(ps);
    FunctionalAdagrad fn(ps, AdagradOptions(0.1));
    const ParamState st0 = deep_copy(*fn.state_of(ps[0]));
    const Tensor g1 = tensor_of(values<float>(6, 6), {2, 3});
    fn.step({Tensor(), g1, Tensor()});
    CHECK(ps[0].equal(ref[0]));
    CHECK(ps[2].equal(ref[2]));
    require_same_state(st0, *fn.state_of(ps[0]));  // step still 0
    CHECK(fn.state_of(ps[2])->at("step").item() == 0.0);
    CHECK(fn.state_of(ps[1])->at("step").item() == 1.0);
    Adagrad cls(std::vector<Tensor>{ref[1]}, AdagradOptions(0.1));
    ref[1].set_grad(g1);
    cls.step();
    CHECK(ps[1].equal(ref[1]));
  }
  SECTION("Adadelta counts its steps") {
    Tensor p = tensor_of(values<float>(4, 1));
    FunctionalAdadelta fn({p});
    for (int t = 0; t < 3; ++t) fn.step({tensor_of(values<float>(4, 10 + t))});
    const Tensor& step = fn.state_of(p)->at("step");
    CHECK(step.dtype() == DType::int64);
    CHECK(step.item() == 3.0);
  }
  SECTION("step counters have the class's dtype") {
    Tensor p = tensor_of(values<float>(4, 1));
    const Tensor g = tensor_of(values<float>(4, 2));
    FunctionalRMSprop rms({p});
    rms.step({g});
    CHECK(rms.state_of(p)->at("step").dtype() == DType::int64);
    Tensor q = p.clone();
    FunctionalRprop rp({q});
    rp.step({g});
    CHECK(rp.state_of(q)->at("step").dtype() == DType::int64);
    Tensor r = p.clone();
    FunctionalAdam adam({r});
    adam.step({g});
    CHECK(adam.state_of(r)->at("step").dtype() == DType::float32);
  }
}

TEST_CASE("Functional step_param: params outside the list, None grads", "[optB][functional]") {
  auto fn = std::make_unique<FunctionalAdam>(std::vector<Tensor>{}, AdamOptions(0.01), true);
  Tensor p = tensor_of(values<float>(7, 1));
  const Tensor p0 = p.clone();
  fn->step_param(p, Tensor());
  CHECK(fn->state_of(p) == nullptr);  // torch creates state here; dopt does not
  CHECK(p.equal(p0));
  const Tensor g = tensor_of(values<float>(7, 2));
  fn->step_param(p, g);
  fn->step_param(p, g);
  CHECK(fn->state_of(p)->at("step").item() == 2.0);
  Tensor q = p0.clone();
  Adam cls({q}, AdamOptions(0.01));
  q.set_grad(g);
  cls.step();
  cls.step();
  CHECK(p.equal(q));
  CHECK_THROWS_AS(fn->step_param(p, Tensor::zeros({3})), ShapeError);
  CHECK_THROWS_AS(fn->step_param(Tensor(), g), TypeError);
  // The parameter appears in state_dict after the (empty) list.
  const StateDict sd = fn->state_dict();
  REQUIRE(sd.param_groups.size() == 1);
  CHECK(sd.param_groups[0].params == std::vector<std::int64_t>{0});
  CHECK(sd.state.at(0).at("step").item() == 2.0);
  // step works with an empty list and an empty gradient list
  CHECK_NOTHROW(fn->step({}));
}

TEST_CASE("Functional state_dict / load_state_dict round trip continues bit-identically", "[optB][functional]") {
  std::vector<Tensor> pa = make_params(21);
  FunctionalRMSprop a(pa, RMSpropOptions(0.02).momentum(0.9));
  for (int t = 0; t < 3; ++t) a.step(grads_of(pa, t));
  const StateDict sd = a.state_dict();
  REQUIRE(sd.param_groups.size() == 1);
  CHECK(sd.param_groups[0].hyperparams == a.defaults());
  CHECK(sd.param_groups[0].params == std::vector<std::int64_t>{0, 1, 2});
  CHECK(sd.state.size() == 3u);
  std::vector<Tensor> pb = clones(pa);
  FunctionalRMSprop b(pb, RMSpropOptions(0.5).momentum(0.1));
  b.load_state_dict(sd);
  CHECK(b.defaults() == a.defaults());
  // The loaded state is a copy, not shared.
  CHECK_FALSE(b.state_of(pb[0])->at("square_avg").shares_storage_with(a.state_of(pa[0])->at("square_avg")));
  for (int t = 3; t < 7; ++t) {
    const auto gs = grads_of(pa, t);
    a.step(gs);
    b.step(gs);
    for (std::size_t i = 0; i < pa.size(); ++i) REQUIRE(pa[i].equal(pb[i]));
  }
  require_same_state_maps(a.state(), pa, b.state(), pb);

  SECTION("mismatched layouts are StateDictErrors") {
    FunctionalRMSprop two(std::vector<Tensor>{pb[0], pb[1]});
    CHECK_THROWS_AS(two.load_state_dict(sd), StateDictError);
    StateDict two_groups = sd;
    two_groups.param_groups.push_back(sd.param_groups[0]);
    CHECK_THROWS_AS(b.load_state_dict(two_groups), StateDictError);
  }
  SECTION("a float64 parameter gets its state cast, step kept") {
    std::vector<Tensor> pd;
    for (const auto& p : pa) pd.push_back(p.to(DType::float64));
    FunctionalRMSprop d(pd, RMSpropOptions());
    d.load_state_dict(sd);
    CHECK(d.state_of(pd[0])->at("square_avg").dtype() == DType::float64);
    CHECK(d.state_of(pd[0])->at("step").dtype() == DType::int64);
  }
}
