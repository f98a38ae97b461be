#pragma once
// The Optimizer-base contract as a Catch test body, for the unit test of each
// optimizer (optim/src/*.test.cpp): called inside a TEST_CASE on the test
// thread; it opens its own SECTIONs.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "bitwise_checks.hpp"
#include "dopt/optim/optimizer.hpp"
#include "reference_data.hpp"

namespace dopt::testing {

using optim::OptimizerParamGroup;

/// The Optimizer-base contract (spec section 1) for optimizer Opt:
/// duplicate params across groups and empty lists are ValueErrors, a param
/// without a grad is left alone, a state_dict round trip into a fresh
/// optimizer continues bit-identically (hyperparameters come from the dict),
/// and mismatched group counts/sizes are StateDictErrors.
/// `a` must create per-param state; `b` differs from `a` in some value.
/// eager_state: the optimizer creates state at construction (Adagrad).
template <class Opt, class Options>
void check_optimizer_contract(const Options& a, const Options& b, bool eager_state) {
  using Groups = std::vector<OptimizerParamGroup>;
  SECTION("a parameter in two groups is a ValueError") {
    Tensor p = tensor_of(values<float>(kRefNumel, 1));
    CHECK_THROWS_AS(Opt(Groups{OptimizerParamGroup({p}), OptimizerParamGroup({p})}, a), ValueError);
  }
  SECTION("an empty parameter list is a ValueError") {
    CHECK_THROWS_AS(Opt(std::vector<Tensor>{}, a), ValueError);
    CHECK_THROWS_AS(Opt(Groups{}, a), ValueError);
  }
  SECTION("a parameter without a grad is skipped") {
    Tensor p1 = tensor_of(values<float>(kRefNumel, 1)), p2 = tensor_of(values<float>(5, 2));
    Opt opt(std::vector<Tensor>{p1, p2}, a);
    const Tensor p1_before = p1.clone(), p2_before = p2.clone();
    ParamState p2_state_before;
    if (eager_state) {
      REQUIRE(opt.state().count(p2.key()) == 1);
      p2_state_before = deep_copy(opt.state().at(p2.key()));
    }
    p1.set_grad(tensor_of(values<float>(kRefNumel, 3)));
    opt.step();
    opt.step();
    CHECK_FALSE(p1.equal(p1_before));
    CHECK(p2.equal(p2_before));
    if (eager_state) require_same_state(p2_state_before, opt.state().at(p2.key()));
    else CHECK(opt.state().count(p2.key()) == 0);
  }
  SECTION("state_dict / load_state_dict round trip continues bit-identically") {
    std::vector<Tensor> ps{tensor_of(values<float>(kRefNumel, 11)), tensor_of(values<float>(6, 12), {2, 3}),
                           tensor_of(values<float>(5, 13))};
    auto make = [](const std::vector<Tensor>& p, const Options& o) {
      return std::make_unique<Opt>(Groups{OptimizerParamGroup({p[0]}, o), OptimizerParamGroup({p[1], p[2]})}, o);
    };
    auto opt_a = make(ps, a);
    auto set_grads = [&](int t, bool last_too) {
      std::vector<Tensor> gs;
      for (std::size_t i = 0; i < ps.size(); ++i) {
        Tensor g = (i + 1 < ps.size() || last_too)
                       ? tensor_of(values<float>(static_cast<std::size_t>(ps[i].numel()), 100 * t + i, 2.0),
                                   ps[i].shape())
                       : Tensor();
        gs.push_back(g);
      }
      return gs;
    };
    // Three steps in which the last parameter has no grad (so it has no lazy state yet).
    for (int t = 0; t < 3; ++t) {
      auto gs = set_grads(t, false);
      for (std::size_t i = 0; i < ps.size(); ++i) ps[i].set_grad(gs[i]);
      opt_a->step();
    }
    const StateDict sd = opt_a->state_dict();
    std::vector<Tensor> qs;
    for (const auto& p : ps) qs.push_back(p.clone());
    auto opt_b = make(qs, b);
    REQUIRE(opt_b->param_groups()[0].options->to_hyperparams() != opt_a->param_groups()[0].options->to_hyperparams());
    opt_b->load_state_dict(sd);
    for (std::size_t gi = 0; gi < 2; ++gi)
      CHECK(opt_b->param_groups()[gi].options->to_hyperparams() ==
            opt_a->param_groups()[gi].options->to_hyperparams());
    for (int t = 3; t < 7; ++t) {
      auto gs = set_grads(t, true);
      for (std::size_t i = 0; i < ps.size(); ++i) ps[i].set_grad(gs[i]), qs[i].set_grad(gs[i]);
      opt_a->step();
      opt_b->step();
      for (std::size_t i = 0; i < ps.size(); ++i) {
        INFO("step " << t << " param " << i);
        REQUIRE(ps[i].equal(qs[i]));
      }
    }
    for (std::size_t i = 0; i < ps.size(); ++i) {
      INFO("param " << i);
      require_same_state(opt_a->state().at(ps[i].key()), opt_b->state().at(qs[i].key()));
    }

    SECTION("mismatched group count or size is a StateDictError") {
      std::vector<Tensor> rs;
      for (const auto& p : ps) rs.push_back(p.clone());
      Opt one_group(rs, b);
      CHECK_THROWS_AS(one_group.load_state_dict(sd), StateDictError);
      Opt other_sizes(Groups{OptimizerParamGroup({rs[0], rs[1]}), OptimizerParamGroup({rs[2]})}, b);
      CHECK_THROWS_AS(other_sizes.load_state_dict(sd), StateDictError);
    }
  }
}

}  // namespace dopt::testing
