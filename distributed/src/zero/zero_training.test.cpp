// ZeroRedundancyOptimizer with the single-rank training utilities of
// dopt/optim/ (zero_training.cpp): clip_grad_norm sharded over ZeRO's ranks
// (bit for bit the local result at 3 and 5 ranks; a non-finite norm throws
// on every rank), GradScaler skipping a step on every rank when one rank's
// shard holds an inf (2, 3, 5 ranks), LR schedulers driving the owners.
// (Moved from optim/src/clip_grad.test.cpp, grad_scaler.test.cpp and
// lr_scheduler.test.cpp when optim stopped knowing ZeRO.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/clip_grad.hpp"
#include "dopt/optim/grad_scaler.hpp"
#include "dopt/optim/lr_scheduler.hpp"
#include "dopt/optim/sgd.hpp"
#include "grad_scaler_fixture.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;
using dopt::testing::tensor_of;
using dopt::testing::values;

namespace {

using dopt::testing::kInf;
using dopt::testing::small_scaler;
using dopt::testing::make_params;
using dopt::testing::set_grads;
using dopt::testing::all_equal;

using dopt::testing::clip_grads;

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("clip_grad_norm(ZeroRedundancyOptimizer) is the local clip over the full gradients, bit for bit (3, 5 ranks)",
          "[clip_grad][zero]") {
  for (int world : {3, 5}) {
    for (double p : {2.0, 1.0, kInfNorm}) {
      DYNAMIC_SECTION("world " << world << " p=" << p) {
        // The reference: every gradient, clipped locally.
        auto ref = clip_grads<float>(21, 4.0);
        std::vector<Tensor> local;
        for (const auto& g : ref) {
          local.push_back(Tensor::zeros({static_cast<std::int64_t>(g.size())}));
          local.back().set_grad(tensor_of(g));
        }
        local[2].set_grad(Tensor());  // one parameter without a gradient
        ClipGradNormOptions o;
        o.norm_type = p;
        const double want = clip_grad_norm(local, 2.5, o);
        std::mutex m;
        std::vector<double> totals;
        std::vector<std::string> problems;
        simulate(world, [&](RankContext& ctx) {
          std::vector<Tensor> params;
          for (const auto& g : ref) {
            params.push_back(Tensor::zeros({static_cast<std::int64_t>(g.size())}));
            params.back().set_grad(tensor_of(g));
          }
          params[2].set_grad(Tensor());
          ZeroOptions zo;
          zo.process_group = ctx.world();
          ZeroRedundancyOptimizer zero(params, AdamOptions(0.1), zo);
          const double total = clip_grad_norm(zero, 2.5, o);
          const auto owners = zero.param_owners();
          std::lock_guard<std::mutex> lock(m);
          totals.push_back(total);
          for (std::size_t k = 0; k < params.size(); ++k) {
            if (!params[k].grad().defined()) continue;
            const bool owned = owners[k] == ctx.rank();
            // owned gradients are clipped exactly as the local ones; the others untouched
            const bool ok = owned ? params[k].grad().equal(local[k].grad()) : params[k].grad().equal(tensor_of(ref[k]));
            if (!ok) problems.push_back("rank " + std::to_string(ctx.rank()) + " param " + std::to_string(k));
          }
        });
        CHECK(problems.empty());
        REQUIRE(totals.size() == static_cast<std::size_t>(world));
        for (double t : totals) CHECK(same_bits(t, want));
      }
    }
  }
}

TEST_CASE("clip_grad_norm(ZeroRedundancyOptimizer): a non-finite norm on one rank's shard throws on every rank",
          "[clip_grad][zero]") {
  std::mutex m;
  int threw = 0;
  bool unchanged = true;
  simulate(3, [&](RankContext& ctx) {
    std::vector<Tensor> params;
    for (int k = 0; k < 6; ++k) {
      params.push_back(Tensor::zeros({5 + k}));
      params.back().set_grad(Tensor::full({5 + k}, 1.0));
    }
    ZeroOptions zo;
    zo.process_group = ctx.world();
    ZeroRedundancyOptimizer zero(params, SGDOptions(0.1), zo);
    // an inf in parameter 0's gradient, which one rank owns
    const int owner0 = zero.param_owners()[0];
    if (ctx.rank() == owner0) params[0].grad().data<float>()[2] = std::numeric_limits<float>::infinity();
    try {
      clip_grad_norm(zero, 1.0, {.error_if_nonfinite = true});
    } catch (const ValueError& e) {
      std::lock_guard<std::mutex> lock(m);
      ++threw;
    }
    std::lock_guard<std::mutex> lock(m);
    for (int k = 1; k < 6; ++k) unchanged = unchanged && params[static_cast<std::size_t>(k)].grad().at(0) == 1.0;
  });
  CHECK(threw == 3);
  CHECK(unchanged);
}

TEST_CASE("GradScaler + ZeRO: an inf on one rank's shard skips the step on every rank (2, 3, 5 ranks)",
          "[grad_scaler][zero]") {
  for (int world : {2, 3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      // Reference: a local Adam that skips step 1 and takes the others.
      auto ref = make_params(6, 40);
      Adam ref_opt(ref, AdamOptions(0.05));
      for (int t = 0; t < 4; ++t) {
        set_grads(ref, t, -1, 1.0);
        if (t != 1) ref_opt.step();
      }
      std::mutex m;
      std::vector<std::vector<bool>> stepped(static_cast<std::size_t>(world));
      std::vector<double> scales;
      int mismatches = 0;
      simulate(world, [&](RankContext& ctx) {
        auto ps = make_params(6, 40);
        ZeroOptions zo;
        zo.process_group = ctx.world();
        ZeroRedundancyOptimizer zero(ps, AdamOptions(0.05), zo);
        GradScaler scaler(small_scaler());
        // the planted rank: the last one, in a gradient it owns
        const int planted = world - 1;
        std::size_t owned = 0;
        while (zero.param_owners()[owned] != planted) ++owned;
        std::vector<bool> mine;
        for (int t = 0; t < 4; ++t) {
          set_grads(ps, t, -1, scaler.get_scale());
          if (t == 1 && ctx.rank() == planted) ps[owned].grad().data<float>()[0] = kInf;
          mine.push_back(scaler.step(zero));
          scaler.update();
        }
        std::lock_guard<std::mutex> lock(m);
        stepped[static_cast<std::size_t>(ctx.rank())] = mine;
        scales.push_back(scaler.get_scale());
        mismatches += !all_equal(ps, ref);
      });
      for (const auto& s : stepped) CHECK(s == std::vector<bool>{true, false, true, true});
      for (double s : scales) CHECK(s == 8.0 * 0.25);  // backed off at step 1; 2 good steps since: no growth yet
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("Schedulers drive ZeroRedundancyOptimizer's owners: 3 ranks equal a local Adam with the same schedule",
          "[lr_scheduler][zero]") {
  const int world = 3, steps = 6;
  auto make_params = [] {
    std::vector<Tensor> ps;
    for (int k = 0; k < 5; ++k) ps.push_back(tensor_of(values<float>(static_cast<std::size_t>(4 + 3 * k), 30 + k)));
    return ps;
  };
  auto grad = [](int t, int k, std::int64_t n) {
    return tensor_of(values<float>(static_cast<std::size_t>(n), 500 + 10 * t + k, 2.0));
  };
  auto local = make_params();
  Adam ref(local, AdamOptions(0.05));
  OneCycleLROptions oc;
  oc.max_lr = {0.2};
  oc.total_steps = steps;
  OneCycleLR ref_sched(ref, oc);
  for (int t = 0; t < steps; ++t) {
    for (int k = 0; k < 5; ++k) local[static_cast<std::size_t>(k)].set_grad(grad(t, k, local[static_cast<std::size_t>(k)].numel()));
    ref.step();
    ref_sched.step();
  }
  std::mutex m;
  int mismatches = 0;
  simulate(world, [&](RankContext& ctx) {
    auto ps = make_params();
    ZeroOptions zo;
    zo.process_group = ctx.world();
    ZeroRedundancyOptimizer zero(ps, AdamOptions(0.05), zo);
    OneCycleLR sched(zero, oc);
    for (int t = 0; t < steps; ++t) {
      for (int k = 0; k < 5; ++k) ps[static_cast<std::size_t>(k)].set_grad(grad(t, k, ps[static_cast<std::size_t>(k)].numel()));
      zero.step();
      sched.step();
    }
    int bad = 0;
    for (int k = 0; k < 5; ++k) bad += !ps[static_cast<std::size_t>(k)].equal(local[static_cast<std::size_t>(k)]);
    // the schedule's last values wait in ZeRO's groups for the next step
    const Hyperparams h = zero.param_groups()[0].options->to_hyperparams();
    bad += std::get<double>(h.at("lr")) != ref.param_groups()[0].options->get_lr();
    bad += h.at("betas") != ref.param_groups()[0].options->to_hyperparams().at("betas");
    std::lock_guard<std::mutex> lock(m);
    mismatches += bad;
  });
  CHECK(mismatches == 0);
}
