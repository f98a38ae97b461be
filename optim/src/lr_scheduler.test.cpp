// Learning-rate schedulers: LambdaLR against its formula, the schedules'
// landmarks, every scheduler's state-dict round trip, composites, errors,
// ReduceLROnPlateau. (The traced classes are checked bit for bit against
// torch by the conformance cases; schedules driving ZeRO and
// PostLocalSGDOptimizer in distributed/src/zero/zero_training.test.cpp and
// distributed/src/local_sgd/post_local_sgd_training.test.cpp,
// DistributedOptimizer's remote owners in distributed_optimizer.test.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>

#include "dopt/optim/adam.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/optim/rmsprop.hpp"
#include "dopt/optim/sgd.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;
using Catch::Matchers::Contains;

namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

/// Two groups (lr 0.1 and 0.02), SGD with momentum, or Adam.
std::unique_ptr<Optimizer> two_groups(bool adam) {
  std::vector<OptimizerParamGroup> g;
  Tensor a = Tensor::zeros({3}), b = Tensor::zeros({2});
  if (adam) {
    g.emplace_back(std::vector<Tensor>{a}, AdamOptions(0.1));
    g.emplace_back(std::vector<Tensor>{b}, AdamOptions(0.02));
    return std::make_unique<Adam>(std::move(g), AdamOptions(0.1));
  }
  g.emplace_back(std::vector<Tensor>{a}, SGDOptions(0.1).momentum(0.9));
  g.emplace_back(std::vector<Tensor>{b}, SGDOptions(0.02).momentum(0.9));
  return std::make_unique<SGD>(std::move(g), SGDOptions(0.1).momentum(0.9));
}

using Factory = std::function<std::unique_ptr<LRScheduler>(Optimizer&)>;

/// One of every class, with non-default arguments.
std::vector<std::pair<std::string, Factory>> all_schedulers() {
  return {
      {"LambdaLR", [](Optimizer& o) { return std::make_unique<LambdaLR>(o, [](std::int64_t e) { return 1.0 / (1 + e); }); }},
      {"StepLR", [](Optimizer& o) { return std::make_unique<StepLR>(o, 3, 0.5); }},
      {"MultiStepLR", [](Optimizer& o) { return std::make_unique<MultiStepLR>(o, std::vector<std::int64_t>{2, 5, 5}, 0.3); }},
      {"ConstantLR", [](Optimizer& o) { return std::make_unique<ConstantLR>(o, 0.25, 4); }},
      {"LinearLR", [](Optimizer& o) { return std::make_unique<LinearLR>(o, 0.2, 0.9, 6); }},
      {"ExponentialLR", [](Optimizer& o) { return std::make_unique<ExponentialLR>(o, 0.9); }},
      {"PolynomialLR", [](Optimizer& o) { return std::make_unique<PolynomialLR>(o, 7, 1.5); }},
      {"CosineAnnealingLR", [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 4, 0.001); }},
      {"CosineAnnealingWarmRestarts",
       [](Optimizer& o) { return std::make_unique<CosineAnnealingWarmRestarts>(o, 2, 2, 0.001); }},
      {"CyclicLR",
       [](Optimizer& o) {
         CyclicLROptions c;
         c.base_lr = {0.01, 0.002};
         c.max_lr = {0.1};
         c.step_size_up = 3;
         c.step_size_down = 2;
         c.mode = "exp_range";
         c.gamma = 0.9;
         return std::make_unique<CyclicLR>(o, c);
       }},
      {"OneCycleLR",
       [](Optimizer& o) {
         OneCycleLROptions c;
         c.max_lr = {0.5, 0.1};
         c.total_steps = 20;
         c.three_phase = true;
         c.anneal_strategy = "linear";
         return std::make_unique<OneCycleLR>(o, c);
       }},
      {"SequentialLR",
       [](Optimizer& o) {
         std::vector<std::unique_ptr<LRScheduler>> kids;
         kids.push_back(std::make_unique<LinearLR>(o, 0.1, 1.0, 3));
         kids.push_back(std::make_unique<CosineAnnealingLR>(o, 5, 0.0));
         return std::make_unique<SequentialLR>(o, std::move(kids), std::vector<std::int64_t>{4});
       }},
      {"ChainedScheduler",
       [](Optimizer& o) {
         std::vector<std::unique_ptr<LRScheduler>> kids;
         kids.push_back(std::make_unique<ConstantLR>(o, 0.5, 3));
         kids.push_back(std::make_unique<ExponentialLR>(o, 0.8));
         return std::make_unique<ChainedScheduler>(std::move(kids));
       }},
  };
}

std::vector<double> momenta(Optimizer& o) {
  std::vector<double> out;
  ScheduleTarget t(o);
  for (std::size_t g = 0; g < t.num_groups(); ++g) out.push_back(t.has_momentum() ? t.momentum(g) : t.beta1(g));
  return out;
}

}  // namespace

TEST_CASE("LambdaLR: lr = base_lr * lambda(epoch), one function or one per group", "[lr_scheduler]") {
  auto opt = two_groups(false);
  LambdaLR one(*opt, [](std::int64_t e) { return std::pow(0.95, static_cast<double>(e)); });
  for (std::int64_t e = 0; e < 6; ++e) {
    if (e > 0) one.step();
    CHECK(one.last_epoch() == e);
    CHECK(same_bits(opt->param_groups()[0].options->get_lr(), 0.1 * std::pow(0.95, static_cast<double>(e))));
    CHECK(same_bits(opt->param_groups()[1].options->get_lr(), 0.02 * std::pow(0.95, static_cast<double>(e))));
  }
  auto opt2 = two_groups(false);
  LambdaLR per(*opt2, std::vector<LambdaLR::Lambda>{[](std::int64_t e) { return static_cast<double>(e / 2); },
                                                     [](std::int64_t e) { return 1.0 + static_cast<double>(e); }});
  per.step();
  per.step();
  CHECK(per.get_last_lr() == std::vector<double>{0.1 * 1.0, 0.02 * 3.0});
  CHECK_THROWS_AS(LambdaLR(*opt2, std::vector<LambdaLR::Lambda>{[](std::int64_t) { return 1.0; }}), ValueError);
}

TEST_CASE("Schedulers: the landmarks of each schedule", "[lr_scheduler]") {
  SECTION("StepLR / MultiStepLR / ExponentialLR chainable = closed form here") {
    auto opt = two_groups(false);
    StepLR s(*opt, 2, 0.5);
    std::vector<double> seen;
    for (int e = 0; e < 6; ++e, s.step()) seen.push_back(s.get_last_lr()[0]);
    CHECK(seen == std::vector<double>{0.1, 0.1, 0.05, 0.05, 0.025, 0.025});
    auto opt2 = two_groups(false);
    MultiStepLR ms(*opt2, {3, 1, 3}, 0.1);  // unsorted, with a repetition
    std::vector<double> m;
    for (int e = 0; e < 5; ++e, ms.step()) m.push_back(ms.get_last_lr()[1]);
    CHECK(m[0] == 0.02);
    CHECK(m[1] == 0.02 * 0.1);
    CHECK(m[3] == 0.02 * 0.1 * std::pow(0.1, 2.0));
  }
  SECTION("ConstantLR, LinearLR start scaled and end at the base lr") {
    auto opt = two_groups(false);
    ConstantLR c(*opt, 0.5, 2);
    CHECK(c.get_last_lr()[0] == 0.1 * 0.5);
    c.step();
    c.step();
    CHECK(c.get_last_lr()[0] == 0.1 * 0.5 * (1.0 / 0.5));
    auto opt2 = two_groups(false);
    LinearLR l(*opt2, 0.25, 1.0, 4);
    CHECK(l.get_last_lr()[0] == 0.1 * 0.25);
    for (int k = 0; k < 6; ++k) l.step();
    CHECK(std::abs(l.get_last_lr()[0] - 0.1) < 1e-15);
  }
  SECTION("CosineAnnealingLR reaches eta_min at T_max; PolynomialLR reaches 0 at total_iters") {
    auto opt = two_groups(false);
    CosineAnnealingLR c(*opt, 4, 0.001);
    for (int k = 0; k < 4; ++k) c.step();
    CHECK(std::abs(c.get_last_lr()[0] - 0.001) < 1e-15);
    auto opt2 = two_groups(false);
    PolynomialLR p(*opt2, 3, 2.0);
    for (int k = 0; k < 3; ++k) p.step();
    CHECK(p.get_last_lr()[0] == 0.0);
    p.step();
    CHECK(p.get_last_lr()[0] == 0.0);
  }
  SECTION("CosineAnnealingWarmRestarts restarts after T_0, then T_0 * T_mult") {
    auto opt = two_groups(false);
    CosineAnnealingWarmRestarts w(*opt, 2, 2, 0.0);
    std::vector<double> lr;
    for (int e = 0; e < 8; ++e, w.step()) lr.push_back(w.get_last_lr()[0]);
    CHECK(lr[0] == 0.1);
    CHECK(lr[2] == 0.1);  // restart at 2
    CHECK(lr[6] == 0.1);  // then at 2 + 4
    CHECK(lr[4] < lr[3]);
    w.step_epoch(2.5);  // fractional epochs, as torch
    CHECK(w.last_epoch() == 2);
    CHECK_THROWS_AS(w.step_epoch(-1), ValueError);
  }
  SECTION("CyclicLR: base at 0, max after step_size_up, momentum inverse; also cycles Adam's beta1") {
    auto opt = two_groups(false);
    CyclicLROptions o;
    o.base_lr = {0.01};
    o.max_lr = {0.1};
    o.step_size_up = 2;
    CyclicLR c(*opt, o);
    CHECK(c.get_last_lr()[0] == 0.01);
    CHECK(momenta(*opt)[0] == 0.9);
    c.step();
    c.step();
    CHECK(c.get_last_lr()[0] == 0.1);
    CHECK(momenta(*opt)[0] == 0.8);
    auto adam = two_groups(true);
    CyclicLR ca(*adam, o);
    ca.step();
    CHECK(momenta(*adam)[0] == Approx(0.85).epsilon(1e-15));
    o.mode = "sawtooth";
    auto opt3 = two_groups(false);
    CHECK_THROWS_AS(CyclicLR(*opt3, o), ValueError);
  }
  SECTION("OneCycleLR: initial, peak, end; past total_steps is an error") {
    auto opt = two_groups(true);
    OneCycleLROptions o;
    o.max_lr = {1.0};
    o.total_steps = 10;
    o.pct_start = 0.5;
    OneCycleLR s(*opt, o);
    CHECK(s.get_last_lr()[0] == Approx(1.0 / 25.0).epsilon(1e-15));
    CHECK(momenta(*opt)[0] == 0.95);
    for (int k = 0; k < 4; ++k) s.step();
    CHECK(s.get_last_lr()[0] == 1.0);  // end of the first phase (step 4 = 0.5 * 10 - 1)
    CHECK(momenta(*opt)[0] == 0.85);
    for (int k = 0; k < 5; ++k) s.step();
    CHECK(std::abs(s.get_last_lr()[0] - 1.0 / 25.0 / 1e4) < 1e-18);
    s.step();  // last_epoch == total_steps is allowed
    CHECK_THROWS_WITH(s.step(), Contains("Tried to step 12 times. The specified number of total steps is 10"));
    auto opt2 = two_groups(false);
    OneCycleLROptions bad;
    bad.max_lr = {0.1};
    CHECK_THROWS_WITH(OneCycleLR(*opt2, bad), Contains("total_steps"));
    bad.total_steps = 5;
    bad.max_lr = {0.1, 0.2, 0.3};
    CHECK_THROWS_WITH(OneCycleLR(*opt2, bad), Contains("expected 2 values for max_lr, got 3"));
  }
}

TEST_CASE("Schedulers: every class's state dict round trip continues identically", "[lr_scheduler]") {
  for (const auto& [name, make] : all_schedulers()) {
    DYNAMIC_SECTION(name) {
      const bool adam = name == "OneCycleLR";
      auto opt_a = two_groups(adam);
      auto sched_a = make(*opt_a);
      for (int k = 0; k < 5; ++k) sched_a->step();
      const SchedulerStateDict sd = sched_a->state_dict();
      CHECK(std::get<std::string>(sd.at("_class")) == name);
      // A fresh optimizer and scheduler, restored as torch users do: both state dicts.
      auto opt_b = two_groups(adam);
      auto sched_b = make(*opt_b);
      opt_b->load_state_dict(opt_a->state_dict());
      sched_b->load_state_dict(sd);
      CHECK(sched_b->state_dict() == sd);
      CHECK(sched_b->last_epoch() == sched_a->last_epoch());
      for (int k = 0; k < 12; ++k) {
        sched_a->step();
        sched_b->step();
        INFO("step " << k);
        REQUIRE(sched_a->get_last_lr() == sched_b->get_last_lr());
        REQUIRE(momenta(*opt_a) == momenta(*opt_b));
      }
      // A dict of another class is refused and changes nothing.
      auto opt_c = two_groups(adam);
      ExponentialLR other(*opt_c, 0.5);
      if (name == "ExponentialLR") return;
      const auto before = other.state_dict();
      CHECK_THROWS_AS(other.load_state_dict(sd), StateDictError);
      CHECK(other.state_dict() == before);
    }
  }
}

TEST_CASE("ReduceLROnPlateau: patience, cooldown, min_lr, eps, modes, state dict", "[lr_scheduler]") {
  auto opt = two_groups(false);
  ReduceLROnPlateauOptions o;
  o.factor = 0.5;
  o.patience = 1;
  o.cooldown = 1;
  o.min_lr = {0.03, 0.0};
  ReduceLROnPlateau s(*opt, o);
  CHECK(s.get_last_lr() == std::vector<double>{0.1, 0.02});
  s.step(1.0);   // best
  s.step(1.0);   // bad 1
  CHECK(s.get_last_lr()[0] == 0.1);
  s.step(1.0);   // bad 2 > patience: reduce, cooldown 1
  CHECK(s.get_last_lr() == std::vector<double>{0.05, 0.01});
  s.step(2.0);   // in cooldown: not counted
  s.step(2.0);   // bad 1
  s.step(2.0);   // bad 2: reduce; group 0 floors at min_lr
  CHECK(s.get_last_lr() == std::vector<double>{0.03, 0.005});
  const auto sd = s.state_dict();
  auto opt2 = two_groups(false);
  ReduceLROnPlateau r(*opt2);
  opt2->load_state_dict(opt->state_dict());
  r.load_state_dict(sd);
  CHECK(r.state_dict() == sd);
  for (double m : {3.0, 3.0, 3.0, 0.5, 3.0}) {
    s.step(m);
    r.step(m);
    REQUIRE(s.get_last_lr() == r.get_last_lr());
  }
  ReduceLROnPlateauOptions mx;
  mx.mode = "max";
  mx.threshold_mode = "abs";
  mx.threshold = 0.5;
  mx.patience = 0;
  auto opt3 = two_groups(false);
  ReduceLROnPlateau up(*opt3, mx);
  up.step(1.0);
  up.step(1.4);  // not better by 0.5 in abs mode: reduce at once (patience 0)
  CHECK(up.get_last_lr()[0] == 0.1 * 0.1);
  mx.factor = 1.0;
  CHECK_THROWS_WITH(ReduceLROnPlateau(*opt3, mx), Contains("Factor should be < 1.0."));
  mx.factor = 0.1;
  mx.mode = "middle";
  CHECK_THROWS_WITH(ReduceLROnPlateau(*opt3, mx), Contains("mode middle is unknown!"));
}

TEST_CASE("Composite schedulers: torch's construction, one optimizer only", "[lr_scheduler]") {
  auto opt = two_groups(false);
  std::vector<std::unique_ptr<LRScheduler>> kids;
  kids.push_back(std::make_unique<LinearLR>(*opt, 0.2, 1.0, 3));
  // A later scheduler reads the initial_lr the first one recorded.
  kids.push_back(std::make_unique<ExponentialLR>(*opt, 0.7));
  CHECK(kids[1]->base_lrs() == std::vector<double>{0.1, 0.02});
  CHECK(opt->param_groups()[0].initial_lr == 0.1);
  SequentialLR seq(*opt, std::move(kids), {2});
  std::vector<double> lr;
  for (int e = 0; e < 5; ++e, seq.step()) lr.push_back(seq.get_last_lr()[0]);
  CHECK(lr[0] == 0.1 * 0.2);
  CHECK(lr[2] == 0.1);         // the milestone: the second child's closed form at epoch 0
  CHECK(lr[3] == 0.1 * 0.7);
  auto other = two_groups(false);
  std::vector<std::unique_ptr<LRScheduler>> mixed;
  mixed.push_back(std::make_unique<StepLR>(*opt, 2));
  mixed.push_back(std::make_unique<StepLR>(*other, 2));
  CHECK_THROWS_WITH(ChainedScheduler(std::move(mixed)), Contains("to be different"));
  std::vector<std::unique_ptr<LRScheduler>> one;
  one.push_back(std::make_unique<StepLR>(*opt, 2));
  CHECK_THROWS_WITH(SequentialLR(*opt, std::move(one), {1}), Contains("one more than the number of milestone"));
}
