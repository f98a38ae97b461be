// PostLocalSGDOptimizer with the single-rank training utilities of
// dopt/optim/ (post_local_sgd_training.cpp): GradScaler skipping a step on
// every rank while the averager stays on schedule (2, 3, 5 ranks), LR
// schedulers driving the local optimizer. (Moved from
// optim/src/grad_scaler.test.cpp and lr_scheduler.test.cpp when optim
// stopped knowing PostLocalSGDOptimizer.)
#include <catch2/catch.hpp>

#include <limits>
#include <mutex>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/grad_scaler.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/optim/sgd.hpp"
#include "grad_scaler_fixture.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;

using namespace dopt::testing;  // the GradScaler fixture: kInf, small_scaler, make_params, set_grads, ...

TEST_CASE("GradScaler + PostLocalSGDOptimizer: skipped on every rank, the averager stays on schedule (2, 3, 5 ranks)",
          "[grad_scaler][post_local_sgd]") {
  for (int world : {2, 3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      std::mutex m;
      std::vector<std::vector<bool>> stepped;
      std::vector<std::int64_t> averager_steps;
      std::vector<std::vector<Tensor>> after_skip, final_params;
      int manual_mismatch = 0;
      simulate(world, [&](RankContext& ctx) {
        const int r = ctx.rank();
        auto ps = make_params(3, 60);
        PostLocalSGDOptimizer opt(std::make_unique<SGD>(ps, SGDOptions(0.05).momentum(0.5)),
                                  std::make_unique<PeriodicModelAverager>(2, 0, ctx.world()));
        // The same schedule written out: SGD, then the averager, skipping the local step at t = 2.
        auto ref = make_params(3, 60);
        SGD ref_sgd(ref, SGDOptions(0.05).momentum(0.5));
        PeriodicModelAverager ref_avg(2, 0, ctx.world());
        GradScaler scaler(small_scaler());
        std::vector<bool> mine;
        std::vector<Tensor> snap;
        for (int t = 0; t < 5; ++t) {  // the last step (4) averages
          const double s = scaler.get_scale();
          set_grads(ps, t, r, s);
          set_grads(ref, t, r, 1.0);
          // step 2 is an averaging step (period 2, warm-up 0): one rank sees an inf there
          if (t == 2 && r == 1) ps[2].grad().data<float>()[1] = kInf;
          mine.push_back(scaler.step(opt));
          scaler.update();
          if (t != 2) ref_sgd.step();
          ref_avg.average_parameters(ref_sgd.param_groups());
          if (t == 2) snap = clones(ps);
        }
        std::lock_guard<std::mutex> lock(m);
        stepped.push_back(mine);
        averager_steps.push_back(opt.averager().step());
        after_skip.push_back(snap);
        final_params.push_back(clones(ps));
        manual_mismatch += !all_equal(ps, ref);
        manual_mismatch += opt.steps_skipped() != 1 || opt.steps_taken() != 4;
      });
      for (const auto& s : stepped) CHECK(s == std::vector<bool>{true, true, false, true, true});
      for (auto n : averager_steps) CHECK(n == 5);  // one per iteration, skipped ones included
      // The skipped step still averaged: every rank holds the same parameters after it, and at the end.
      for (std::size_t r = 1; r < after_skip.size(); ++r) {
        CHECK(all_equal(after_skip[r], after_skip[0]));
        CHECK(all_equal(final_params[r], final_params[0]));
      }
      CHECK(manual_mismatch == 0);
    }
  }
}

TEST_CASE("Schedulers drive PostLocalSGDOptimizer's local optimizer", "[lr_scheduler][post_local_sgd]") {
  simulate(2, [](RankContext& ctx) {
    std::vector<Tensor> ps{Tensor::zeros({3})};
    PostLocalSGDOptimizer opt(std::make_unique<SGD>(ps, SGDOptions(0.1)),
                              std::make_unique<PeriodicModelAverager>(2, 0, ctx.world()));
    StepLR s(opt, 1, 0.5);
    s.step();
    if (opt.optim().param_groups()[0].options->get_lr() != 0.05) throw StateError("test", "lr not scheduled");
  });
}
