// PostLocalSGDOptimizer over simulated ranks: parity with a manual averager,
// state-dict round trip of the averager's step, the one-schedule check.
#include <catch2/catch.hpp>

#include <map>
#include <mutex>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/sgd.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

std::vector<Tensor> make_params(int seed) {
  std::vector<Tensor> ps;
  for (int k = 0; k < 3; ++k) ps.push_back(testing::tensor_of(testing::values<float>(static_cast<std::size_t>(5 + 3 * k), seed + k)));
  return ps;
}

void set_grads(const std::vector<Tensor>& ps, int rank, int step) {
  for (std::size_t k = 0; k < ps.size(); ++k)
    ps[k].set_grad(testing::tensor_of(testing::values<float>(static_cast<std::size_t>(ps[k].numel()),
                                                       1000 + 97 * rank + 13 * step + static_cast<int>(k))));
}

}  // namespace

TEST_CASE("PostLocalSGDOptimizer == SGD + PeriodicModelAverager(4, 10) applied after each step (world 2, 3, 5)",
          "[post_local_sgd]") {
  for (int world : {2, 3, 5}) {
    std::mutex m;
    int mismatches = 0;
    std::vector<std::int64_t> steps;
    simulate(world, [&](RankContext& ctx) {
      auto a = make_params(1);
      auto b = make_params(1);
      SGD sgd(a, SGDOptions(0.03));
      PeriodicModelAverager manual(4, 10, ctx.world());
      PostLocalSGDOptimizer opt(std::make_unique<SGD>(b, SGDOptions(0.03)),
                                std::make_unique<PeriodicModelAverager>(4, 10, ctx.world()));
      int bad = 0;
      for (int step = 0; step < 20; ++step) {
        set_grads(a, ctx.rank(), step);
        set_grads(b, ctx.rank(), step);
        sgd.step();
        manual.average_parameters(sgd.param_groups());
        opt.step();
        for (std::size_t k = 0; k < a.size(); ++k) bad += a[k].equal(b[k]) ? 0 : 1;
      }
      std::lock_guard<std::mutex> lock(m);
      mismatches += bad;
      steps.push_back(manual.step());
      steps.push_back(opt.averager().step());
    });
    CHECK(mismatches == 0);
    for (auto s : steps) CHECK(s == 20);
  }
}

TEST_CASE("PostLocalSGDOptimizer forwards param_groups, state, zero_grad, add_param_group", "[post_local_sgd]") {
  simulate(2, [&](RankContext& ctx) {
    auto ps = make_params(3);
    PostLocalSGDOptimizer opt(std::make_unique<SGD>(std::vector<Tensor>{ps[0], ps[1]}, SGDOptions(0.1).momentum(0.9)),
                              std::make_unique<PeriodicModelAverager>(2, 0, ctx.world()));
    if (&opt.param_groups() != &opt.optim().param_groups()) throw StateError("test", "param_groups not forwarded");
    opt.add_param_group(OptimizerParamGroup({ps[2]}));
    if (opt.optim().param_groups().size() != 2) throw StateError("test", "add_param_group not forwarded");
    set_grads(ps, ctx.rank(), 0);
    opt.step();
    if (opt.state().size() != 3 || &opt.state() != &opt.optim().state()) throw StateError("test", "state not forwarded");
    opt.zero_grad(true);
    for (auto& p : ps)
      if (p.grad().defined()) throw StateError("test", "zero_grad not forwarded");
  });
}

TEST_CASE("PostLocalSGDOptimizer state_dict carries the averager step, load restores it or resets to 0",
          "[post_local_sgd]") {
  std::mutex m;
  std::vector<std::string> saved;
  std::vector<std::int64_t> restored, reset, after_file;
  simulate(3, [&](RankContext& ctx) {
    auto ps = make_params(5);
    PostLocalSGDOptimizer opt(std::make_unique<SGD>(ps, SGDOptions(0.1).momentum(0.5)),
                              std::make_unique<PeriodicModelAverager>(4, 3, ctx.world()));
    for (int step = 0; step < 7; ++step) {
      set_grads(ps, ctx.rank(), step);
      opt.step();
    }
    StateDict sd = opt.state_dict();
    auto ps2 = make_params(5);
    PostLocalSGDOptimizer opt2(std::make_unique<SGD>(ps2, SGDOptions(0.1).momentum(0.5)),
                               std::make_unique<PeriodicModelAverager>(4, 3, ctx.world()));
    opt2.load_state_dict(sd);
    const auto r1 = opt2.averager().step();
    const std::string path = std::string("/tmp/dopt_plsgd_sd_") + std::to_string(ctx.rank()) + ".safetensors";
    save_state_dict(sd, path);
    PostLocalSGDOptimizer opt3(std::make_unique<SGD>(ps2, SGDOptions(0.1).momentum(0.5)),
                               std::make_unique<PeriodicModelAverager>(4, 3, ctx.world()));
    opt3.load_state_dict(load_state_dict(path));
    const auto r3 = opt3.averager().step();
    sd.metadata.erase(kAveragerStepKey);
    opt2.load_state_dict(sd);
    const auto r2 = opt2.averager().step();
    bool bad_step_rejected = false;
    sd.metadata[kAveragerStepKey] = "-4";
    try {
      opt2.load_state_dict(sd);
    } catch (const StateDictError&) {
      bad_step_rejected = true;
    }
    if (!bad_step_rejected) throw StateError("test", "a negative step was accepted");
    std::lock_guard<std::mutex> lock(m);
    saved.push_back(opt.state_dict().metadata.at(kAveragerStepKey));
    restored.push_back(r1);
    after_file.push_back(r3);
    reset.push_back(r2);
  });
  for (auto& s : saved) CHECK(s == "7");
  for (auto s : restored) CHECK(s == 7);
  for (auto s : after_file) CHECK(s == 7);
  for (auto s : reset) CHECK(s == 0);
}

TEST_CASE("one schedule: PostLocalSGDConfig builds matching hook state and averager, a mismatch is a ValueError",
          "[post_local_sgd]") {
  std::mutex m;
  std::vector<std::string> messages;
  simulate(2, [&](RankContext& ctx) {
    PostLocalSGDConfig cfg(ctx.world());
    cfg.start_localSGD_iter = 10;
    cfg.period = 4;
    cfg.subgroup = ctx.world();
    auto state = cfg.make_hook_state();
    auto avg = cfg.make_averager();
    if (state->start_localSGD_iter != 10 || avg->warmup_steps() != 10 || avg->period() != 4)
      throw StateError("test", "config not applied");
    auto ps = make_params(7);
    PostLocalSGDOptimizer ok(std::make_unique<SGD>(ps, SGDOptions(0.1)), std::move(avg), *state);
    std::string msg;
    try {
      PostLocalSGDOptimizer bad(std::make_unique<SGD>(ps, SGDOptions(0.1)),
                                std::make_unique<PeriodicModelAverager>(4, 8, ctx.world()), *state);
    } catch (const ValueError& e) {
      msg = e.what();
    }
    std::lock_guard<std::mutex> lock(m);
    messages.push_back(msg);
  });
  for (auto& msg : messages) {
    CHECK_THAT(msg, Catch::Contains("start_localSGD_iter = 10"));
    CHECK_THAT(msg, Catch::Contains("warmup_steps = 8"));
  }
}
