// ZeRO over parameters whose memory the caller owns (Tensor::from_blob /
// from_dlpack, or views of a caller's buffer). parameters_as_bucket_view and
// overlap_with_ddp re-point parameters at memory ZeRO owns: without
// ZeroOptions::rebind_parameter that is refused at construction; with it the
// caller's own tensors follow every re-pointing. Rank functions record what
// they found; the test thread asserts after simulate() returned.
#include <catch2/catch.hpp>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_overlap.hpp"
#include "reference_data.hpp"
#include "thrown.hpp"
#include "sim_timeout.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

SimulateOptions short_timeout() { return dopt::testing::with_timeout(std::chrono::seconds(30)); }

const std::vector<Shape> kShapes{{5}, {9}, {3, 2}, {7}, {4}};

/// What a trainer owns: its buffers, and its own tensor objects over them
/// (standing in for torch tensors the parameters were imported from).
struct CallerModel {
  std::vector<std::vector<float>> buffers;
  std::vector<Tensor> mine;    // the caller's tensor objects
  std::vector<Tensor> params;  // other tensor objects over the same memory, given to ZeRO

  explicit CallerModel(std::size_t n = kShapes.size()) {
    for (std::size_t i = 0; i < n; ++i) {
      buffers.push_back(dopt::testing::values<float>(static_cast<std::size_t>(shape_numel(kShapes[i])), 11 + i));
      mine.push_back(Tensor::from_blob(buffers.back().data(), kShapes[i], DType::float32));
      params.push_back(Tensor::from_blob(buffers.back().data(), kShapes[i], DType::float32));
    }
  }
  /// The hook an integration provides: the caller's tensor becomes a view of the parameter's new memory.
  std::function<void(const Tensor&)> hook(int* calls) {
    std::map<const TensorImpl*, std::size_t> index;
    for (std::size_t i = 0; i < params.size(); ++i) index[params[i].key()] = i;
    return [this, index, calls](const Tensor& p) {
      mine[index.at(p.key())].set_data(p);
      ++*calls;
    };
  }
};

Tensor grad_for(int step, std::size_t i) {
  return dopt::testing::tensor_of(dopt::testing::values<float>(static_cast<std::size_t>(shape_numel(kShapes[i])),
                                             1000 + 10 * static_cast<std::uint64_t>(step) + i, 0.5),
                         kShapes[i]);
}

/// Runs body on n simulated ranks (30 s timeout): body appends what it finds
/// wrong to `bad` (Catch asserts are not thread-safe); once the ranks have
/// ended, the test thread fails a check for each.
void check_ranks(int n, const std::function<void(RankContext&, std::vector<std::string>& bad)>& body) {
  std::mutex m;
  std::vector<std::string> problems;
  simulate(
      n,
      [&](RankContext& ctx) {
        std::vector<std::string> bad;
        body(ctx, bad);
        std::lock_guard<std::mutex> lock(m);
        problems.insert(problems.end(), bad.begin(), bad.end());
      },
      short_timeout());
  for (const auto& p : problems) FAIL_CHECK(p);
}

std::string error_of(const std::function<void()>& f) { return dopt::testing::what_thrown<ValueError>(f); }

}  // namespace

TEST_CASE("ZeRO refuses caller-owned or shared parameter memory with bucket view or overlap, unless a rebind hook is set",
          "[zero][caller_memory]") {
  std::mutex m;
  std::vector<std::string> msgs, problems;
  simulate(
      3,
      [&](RankContext& ctx) {
        const OptimizerSpec spec{"Adam", {{"lr", 0.01}}};
        std::vector<std::string> got;
        {
          CallerModel cm;
          got.push_back(error_of([&] { ZeroRedundancyOptimizer z(cm.params, spec, ZeroOptions{ctx.world(), true}); }));
          got.push_back(
              error_of([&] { ZeroRedundancyOptimizer z(cm.params, spec, ZeroOptions{ctx.world(), false, true}); }));
        }
        {
          // Owned memory, but the parameters are views of one buffer the caller keeps.
          Tensor flat = Tensor::zeros({12});
          std::vector<Tensor> views{flat.flat_slice(0, 5), flat.flat_slice(5, 7)};
          got.push_back(error_of([&] { ZeroRedundancyOptimizer z(views, spec, ZeroOptions{ctx.world(), true}); }));
        }
        {
          // add_param_group checks the new group's parameters.
          std::vector<Tensor> own{Tensor::zeros({4})};
          ZeroRedundancyOptimizer z(own, spec, ZeroOptions{ctx.world(), true});
          CallerModel cm(1);
          got.push_back(error_of([&] { z.add_param_group(OptimizerParamGroup(cm.params)); }));
        }
        std::vector<std::string> bad;
        // Without bucket view nothing is re-pointed: caller memory is fine and sees the updates.
        CallerModel cm;
        ZeroRedundancyOptimizer z(cm.params, spec, ZeroOptions{ctx.world()});
        for (std::size_t i = 0; i < cm.params.size(); ++i) cm.params[i].set_grad(grad_for(0, i));
        const float before = cm.buffers[0][0];
        z.step();
        if (cm.buffers[0][0] == before) bad.push_back("plain ZeRO did not update the caller's buffer");
        std::lock_guard<std::mutex> lock(m);
        if (ctx.rank() == 0) msgs = got;
        problems.insert(problems.end(), bad.begin(), bad.end());
      },
      short_timeout());
  for (const auto& p : problems) FAIL_CHECK(p);
  REQUIRE(msgs.size() == 4);
  CHECK_THAT(msgs[0], Catch::Contains("parameter 0 (float32[5]) is a view of memory dopt does not own") &&
                          Catch::Contains("parameters_as_bucket_view") && Catch::Contains("rebind_parameter"));
  CHECK_THAT(msgs[1], Catch::Contains("parameter 0") && Catch::Contains("overlap_with_ddp"));
  CHECK_THAT(msgs[2], Catch::Contains("parameter 0 (float32[5]) shares its memory with another tensor"));
  CHECK_THAT(msgs[3], Catch::Contains("add_param_group") && Catch::Contains("parameter 1 (float32[5])"));
}

TEST_CASE("ZeRO bucket view with a rebind hook: the caller's tensors follow every re-pointing, bitwise a plain "
          "optimizer",
          "[zero][caller_memory]") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    check_ranks(world, [&](RankContext& ctx, std::vector<std::string>& bad) {
      const OptimizerSpec spec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
      CallerModel cm;
      std::vector<Tensor> ref;
      for (const auto& p : cm.params) ref.push_back(p.clone());
      cm.params[3].set_requires_grad(false);  // frozen: gets its own copy, the caller follows too
      ref[3].set_requires_grad(false);
      int calls = 0;
      ZeroOptions zo{ctx.world(), true};
      zo.rebind_parameter = cm.hook(&calls);
      std::vector<Tensor> first(cm.params.begin(), cm.params.end() - 1);
      ZeroRedundancyOptimizer z(first, spec, zo);
      if (calls != 4) bad.push_back("the hook ran " + std::to_string(calls) + " times at construction, not 4");
      // add_param_group with caller memory: the hook is set, so it is accepted and rebinds.
      z.add_param_group(OptimizerParamGroup(std::vector<Tensor>{cm.params.back()}));
      auto plain = make_optimizer(spec, {OptimizerParamGroup(ref)});
      for (int step = 0; step < 4; ++step) {
        if (step == 2) {  // trainability change: the buckets are rebuilt and the hook runs again
          cm.params[3].set_requires_grad(true);
          ref[3].set_requires_grad(true);
        }
        for (std::size_t i = 0; i < cm.params.size(); ++i) {
          const bool frozen = !cm.params[i].requires_grad();
          cm.params[i].set_grad(frozen ? Tensor() : grad_for(step, i));
          ref[i].set_grad(frozen ? Tensor() : grad_for(step, i));
        }
        const int before = calls;
        z.step();
        plain->step();
        if (step == 2 && calls == before) bad.push_back("no rebind after the trainability change");
        for (std::size_t i = 0; i < cm.params.size(); ++i) {
          if (!cm.mine[i].shares_storage_with(cm.params[i]))
            bad.push_back("step " + std::to_string(step) + ": the caller's tensor " + std::to_string(i) +
                          " lost the parameter's memory");
          if (!cm.mine[i].equal(ref[i]))
            bad.push_back("step " + std::to_string(step) + ": the caller's tensor " + std::to_string(i) +
                          " differs from the plain optimizer's parameter");
        }
      }
    });
  }
}

TEST_CASE("ZeRO overlap_with_ddp with a rebind hook: the caller's tensors view the overlap buffers", "[zero][caller_memory]") {
  check_ranks(3, [&](RankContext& ctx, std::vector<std::string>& bad) {
    const OptimizerSpec spec{"SGD", {{"lr", 0.1}, {"momentum", 0.9}}};
    CallerModel cm;
    int calls = 0;
    ZeroOptions zo{ctx.world(), false, true};
    zo.rebind_parameter = cm.hook(&calls);
    ZeroRedundancyOptimizer z(cm.params, spec, zo);
    Reducer red(cm.params, ctx.world(), ReducerOptions{.bucket_cap_bytes = 24, .first_bucket_cap_bytes = 24});
    red.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(ctx.world()), red, z));
    if (calls != static_cast<int>(cm.params.size()))
      bad.push_back("the plan rebound " + std::to_string(calls) + " parameters");
    std::vector<Tensor> ref;
    for (const auto& p : cm.params) ref.push_back(p.clone());
    auto plain = make_optimizer(spec, {OptimizerParamGroup(ref)});
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = cm.params.size(); i-- > 0;) {
        cm.params[i].set_grad(grad_for(step + 10 * ctx.rank(), i));
        red.mark_ready(cm.params[i]);
      }
      red.finalize();
      for (std::size_t i = 0; i < ref.size(); ++i) ref[i].set_grad(cm.params[i].grad().clone());
      plain->step();
      for (std::size_t i = 0; i < cm.params.size(); ++i)
        if (!cm.mine[i].shares_storage_with(cm.params[i]) || !cm.mine[i].equal(ref[i]))
          bad.push_back("step " + std::to_string(step) + ": the caller's tensor " + std::to_string(i) +
                        " does not hold the update");
    }
  });
}
