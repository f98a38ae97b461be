// The training-loop helpers over simulated ranks (world sizes 3 and 5):
// average_gradients against an independent computation (each rank's value
// divided by n, summed in rank order), bucket sizes and the async form;
// all_reduce_metrics; CoordinatedStop with a request and a real signal.
// Rank functions record; Catch assertions run after simulate() returned.
#include <catch2/catch.hpp>

#include <csignal>
#include <map>
#include <mutex>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/trainer.hpp"
#include "dopt/runtime/error.hpp"

using namespace dopt;

namespace {

// Gradient element e of parameter i on rank r.
float grad_value(int r, int i, int e) { return 0.37f * static_cast<float>(r + 1) + static_cast<float>(i) * 1.5f + 0.01f * e; }

std::vector<Tensor> params_with_grads(int rank, const std::vector<int>& sizes) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    Tensor p = Tensor::zeros({sizes[i]});
    std::vector<float> g(static_cast<std::size_t>(sizes[i]));
    for (int e = 0; e < sizes[i]; ++e) g[static_cast<std::size_t>(e)] = grad_value(rank, static_cast<int>(i), e);
    p.set_grad(Tensor::from_vector(g));
    ps.push_back(p);
  }
  return ps;
}

}  // namespace

TEST_CASE("average_gradients: every gradient becomes sum_r (g_r / n) in rank order, whatever the buckets",
          "[trainer]") {
  const std::vector<int> sizes{7, 1, 300, 64, 5};
  for (int world : {3, 5}) {
    for (std::size_t bucket : {std::size_t(64), std::size_t(1024), std::size_t(25) << 20}) {
      for (bool async : {false, true}) {
        std::mutex m;
        std::map<int, std::vector<std::vector<float>>> got;
        simulate(world, [&](RankContext& ctx) {
          auto ps = params_with_grads(ctx.rank(), sizes);
          const auto o = AverageGradientsOptions().bucket_bytes(bucket);
          if (async) average_gradients_async(ps, ctx.world(), o).get();
          else average_gradients(ps, ctx.world(), o);
          std::lock_guard<std::mutex> lock(m);
          for (auto& p : ps) got[ctx.rank()].push_back(p.grad().to_vector<float>());
        });
        for (int r = 0; r < world; ++r)
          for (std::size_t i = 0; i < sizes.size(); ++i)
            for (int e = 0; e < sizes[i]; ++e) {
              float expect = 0.0f;
              for (int k = 0; k < world; ++k) {
                const float v = grad_value(k, static_cast<int>(i), e) / static_cast<float>(world);
                expect = k == 0 ? v : expect + v;
              }
              INFO("world " << world << " bucket " << bucket << " async " << async << " rank " << r << " param " << i
                            << " element " << e);
              CHECK(got[r][i][static_cast<std::size_t>(e)] == expect);
            }
      }
    }
  }
}

TEST_CASE("average_gradients: a parameter without a gradient is a ValueError naming it and the rank", "[trainer]") {
  std::mutex m;
  std::vector<std::string> errors;
  simulate(3, [&](RankContext& ctx) {
    auto ps = params_with_grads(ctx.rank(), {4, 4});
    ps.push_back(Tensor::zeros({2}));  // no gradient, on every rank
    try {
      average_gradients(ps, ctx.world());
    } catch (const ValueError& e) {
      std::lock_guard<std::mutex> lock(m);
      errors.push_back(e.what());
    }
  });
  REQUIRE(errors.size() == 3);
  for (const auto& e : errors)
    CHECK_THAT(e, Catch::Matches("average_gradients \\[rank [0-2]\\]: parameter 2 has no gradient .*"));
}

TEST_CASE("all_reduce_metrics: named numbers averaged, summed, min and max over the ranks, and other names fail every "
          "rank",
          "[trainer]") {
  for (int world : {3, 5}) {
    std::mutex m;
    std::map<int, std::map<std::string, double>> avg, sum, mn, mx;
    simulate(world, [&](RankContext& ctx) {
      const double r = ctx.rank();
      const std::map<std::string, double> mine{{"loss", 1.0 + r}, {"accuracy", 0.5 * r}};
      auto a = all_reduce_metrics(ctx.world(), mine);
      auto s = all_reduce_metrics(ctx.world(), mine, ReduceOp::sum);
      auto lo = all_reduce_metrics(ctx.world(), mine, ReduceOp::min);
      auto hi = all_reduce_metrics(ctx.world(), mine, ReduceOp::max);
      std::lock_guard<std::mutex> lock(m);
      avg[ctx.rank()] = a, sum[ctx.rank()] = s, mn[ctx.rank()] = lo, mx[ctx.rank()] = hi;
    });
    double loss_sum = 0, acc_sum = 0;
    for (int k = 0; k < world; ++k) loss_sum += 1.0 + k, acc_sum += 0.5 * k;
    for (int r = 0; r < world; ++r) {
      CHECK(sum[r].at("loss") == loss_sum);
      CHECK(sum[r].at("accuracy") == acc_sum);
      CHECK(avg[r] == avg[0]);  // the same bits everywhere
      CHECK(avg[r].at("loss") == Approx(loss_sum / world));
      CHECK(mn[r].at("loss") == 1.0);
      CHECK(mx[r].at("accuracy") == 0.5 * (world - 1));
    }
  }
  std::mutex m;
  std::vector<std::string> errors;
  simulate(3, [&](RankContext& ctx) {
    std::map<std::string, double> mine{{"loss", 1.0}};
    if (ctx.rank() == 1) mine = {{"los", 1.0}};
    try {
      (void)all_reduce_metrics(ctx.world(), mine);
    } catch (const CollectiveMismatchError& e) {
      std::lock_guard<std::mutex> lock(m);
      errors.push_back(e.what());
    }
  });
  REQUIRE(errors.size() == 3);
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("all_reduce_metrics [rank "));
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("the ranks passed different metric names (this rank: "));
}

TEST_CASE("CoordinatedStop: a request or a signal on one rank stops every rank after the same step, and handlers are put "
          "back",
          "[trainer]") {
  struct sigaction before {};
  ::sigaction(SIGINT, nullptr, &before);
  for (int world : {3, 5}) {
    for (bool by_signal : {false, true}) {
      std::mutex m;
      std::map<int, int> stopped_at;
      simulate(world, [&](RankContext& ctx) {
        CoordinatedStop stop;
        for (int step = 0; step < 50; ++step) {
          if (ctx.rank() == world - 1 && step == 7) {
            if (by_signal) std::raise(SIGINT);
            else stop.request_stop();
          }
          if (stop.should_stop(ctx.world())) {
            std::lock_guard<std::mutex> lock(m);
            stopped_at[ctx.rank()] = step;
            return;
          }
        }
      });
      REQUIRE(static_cast<int>(stopped_at.size()) == world);
      const int at = stopped_at[0];
      CHECK((at == 7 || at == 8));
      for (auto& [r, s] : stopped_at) CHECK(s == at);
    }
  }
  struct sigaction after {};
  ::sigaction(SIGINT, nullptr, &after);
  CHECK(after.sa_handler == before.sa_handler);
}
