// GradScaler: unscaling, growth and back-off (torch's arithmetic), the state
// dict, misuse; the agreement of all ranks on a skipped step with an inf
// planted on one rank (a plain optimizer over a group). (ZeRO and
// PostLocalSGDOptimizer, whose averagers stay on schedule through skipped
// steps: distributed/src/zero/zero_training.test.cpp and
// distributed/src/local_sgd/post_local_sgd_training.test.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <mutex>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/grad_scaler.hpp"
#include "dopt/optim/sgd.hpp"
#include "grad_scaler_fixture.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;
using Catch::Matchers::Contains;

using namespace dopt::testing;  // the GradScaler fixture: kInf, small_scaler, make_params, set_grads, ...

TEST_CASE("GradScaler: scale, unscale, growth after growth_interval good steps, back-off after an inf", "[grad_scaler]") {
  GradScaler scaler(small_scaler());
  CHECK(scaler.get_scale() == 8.0);
  CHECK(scaler.scale(1.5) == 12.0);
  auto ps = make_params(2, 1);
  SGD opt(ps, SGDOptions(0.1));
  auto ref = clones(ps);
  SGD ref_opt(ref, SGDOptions(0.1));
  for (int t = 0; t < 3; ++t) {
    set_grads(ps, t, -1, 8.0);
    set_grads(ref, t, -1, 1.0);
    CHECK(scaler.step(opt));  // unscales (x 1/8, exact), steps
    ref_opt.step();
    CHECK(all_equal(ps, ref));
    CHECK(ps[0].grad().equal(ref[0].grad()));
    scaler.update();
  }
  CHECK(scaler.get_scale() == 16.0);  // grown after 3 good steps
  CHECK(scaler.growth_tracker() == 0);
  // An inf: the step is skipped, the scale backs off, the streak restarts.
  set_grads(ps, 3, -1, 16.0);
  ps[1].grad().data<float>()[0] = kInf;
  const auto before = clones(ps);
  CHECK_FALSE(scaler.step(opt));
  CHECK(scaler.found_inf());
  CHECK(all_equal(ps, before));
  scaler.update();
  CHECK(scaler.get_scale() == 4.0);
  CHECK(scaler.growth_tracker() == 0);
  // NaN counts too; unscale_ first (e.g. to clip), then step.
  set_grads(ps, 4, -1, 4.0);
  ps[0].grad().data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  scaler.unscale_(opt);
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 1.0);
  // update(new_scale)
  set_grads(ps, 5, -1, 1.0);
  CHECK(scaler.step(opt));
  scaler.update(1024.0);
  CHECK(scaler.get_scale() == 1024.0);
}

TEST_CASE("GradScaler: the scale does not grow past float32's range, no 16-bit CPU parameters", "[grad_scaler]") {
  GradScalerOptions o;
  o.init_scale = 3e38;
  o.growth_interval = 1;
  GradScaler scaler(o);
  auto ps = make_params(1, 3);
  SGD opt(ps, SGDOptions(0.1));
  set_grads(ps, 0, -1, 1.0);
  scaler.step(opt);
  scaler.update();
  CHECK(scaler.get_scale() == static_cast<double>(3e38f));
  CHECK(scaler.growth_tracker() == 0);

  // 16-bit parameters in host memory never reach the scaler: the optimizer
  // refuses them when it is built (param_checks.test.cpp).
  Tensor p = Tensor::zeros({2}, DType::float16);
  CHECK_THROWS_AS(SGD({p}, SGDOptions(1.0)), DTypeError);
}

TEST_CASE("GradScaler: state dict round trip, misuse errors, disabled", "[grad_scaler]") {
  GradScaler a(small_scaler());
  auto ps = make_params(1, 2);
  SGD opt(ps, SGDOptions(0.1));
  set_grads(ps, 0, -1, 1.0);
  a.step(opt);
  a.update();
  const Hyperparams sd = a.state_dict();
  CHECK(sd.at("scale") == HyperValue(8.0));
  CHECK(sd.at("_growth_tracker") == HyperValue(1.0));
  GradScaler b;
  b.load_state_dict(sd);
  CHECK(b.state_dict() == sd);
  CHECK_THROWS_AS(b.load_state_dict({}), ValueError);
  CHECK_THROWS_AS(b.load_state_dict({{"scale", 2.0}}), KeyError);

  set_grads(ps, 1, -1, 1.0);
  a.unscale_(opt);
  CHECK_THROWS_WITH(a.unscale_(opt), Contains("unscale_() has already been called"));
  a.step(opt);
  CHECK_THROWS_WITH(a.step(opt), Contains("step() has already been called since the last update()"));
  CHECK_THROWS_WITH(a.unscale_(opt), Contains("after step()"));
  a.update();
  CHECK_THROWS_WITH(a.update(), Contains("No inf checks were recorded prior to update."));
  CHECK_THROWS_AS(GradScaler(GradScalerOptions{.growth_factor = 1.0}), ValueError);
  CHECK_THROWS_AS(GradScaler(GradScalerOptions{.backoff_factor = 1.0}), ValueError);

  GradScaler off(GradScalerOptions{.enabled = false});
  CHECK(off.scale(3.0) == 3.0);
  CHECK(off.get_scale() == 1.0);
  ps[0].grad().data<float>()[0] = kInf;
  CHECK(off.step(opt));  // disabled: plain step
  CHECK(off.state_dict().empty());
}

TEST_CASE("GradScaler with a plain optimizer agrees over GradScalerOptions::process_group", "[grad_scaler]") {
  std::mutex m;
  std::vector<bool> decisions;
  simulate(3, [&](RankContext& ctx) {
    auto ps = make_params(2, 80);
    SGD opt(ps, SGDOptions(0.1));
    GradScalerOptions o = small_scaler();
    o.process_group = ctx.world();
    GradScaler scaler(o);
    set_grads(ps, 0, -1, 8.0);
    if (ctx.rank() == 0) ps[0].grad().data<float>()[0] = kInf;
    const bool s = scaler.step(opt);
    std::lock_guard<std::mutex> lock(m);
    decisions.push_back(s);
  });
  CHECK(decisions == std::vector<bool>{false, false, false});
}

TEST_CASE("has_nonfinite and any_rank", "[grad_scaler]") {
  CHECK_FALSE(has_nonfinite({Tensor::full({5}, 1.0), Tensor(), Tensor::full({2}, -3.0, DType::float64)}));
  Tensor t = Tensor::full({9}, 1.0);
  t.data<float>()[8] = -kInf;
  CHECK(has_nonfinite({t}));
  CHECK(any_rank(true, ProcessGroup{}));
  std::mutex m;
  int yes = 0;
  simulate(5, [&](RankContext& ctx) {
    const bool any = any_rank(ctx.rank() == 3, ctx.world());
    std::lock_guard<std::mutex> lock(m);
    yes += any;
  });
  CHECK(yes == 5);
}
