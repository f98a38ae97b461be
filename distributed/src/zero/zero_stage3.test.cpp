// ZeRO stage 3 (ShardedUnits, zero_stage3.hpp) against stage 1
// (ZeroRedundancyOptimizer with a Reducer) over simulated ranks: the same
// final parameters and consolidated optimizer state, bit for bit (memcmp),
// at world sizes 1, 2, 3 and 5, for Adam and SGD with momentum, with the
// fp16 hook against the same hook in stage 1; the bytes each rank keeps;
// the refusals and the caller's errors; checkpoints between stages and world
// sizes. Rank functions only record; the test thread asserts after
// simulate() returned.
#include <catch2/catch.hpp>

#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/optim/sgd.hpp"
#include "zero_stage3_run.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

using dopt::testing::Stage3Outcome;
using dopt::testing::Stage3Run;

std::string bytes_of(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.nbytes()));
}

// A state dict as bytes: "index key bytes" per tensor, in order.
std::vector<std::string> state_bytes(const StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& [idx, st] : sd.state)
    for (const auto& [key, tensor] : st) out.push_back(std::to_string(idx) + " " + key + " " + bytes_of(tensor));
  return out;
}

// Rank 0's parameters and consolidated state, and every rank's counts.
struct Result {
  std::vector<std::string> params, state;
  std::vector<Stage3Outcome> counts;  // tensors dropped
};

Result train(const Stage3Run& run, int world, bool stage3) {
  Result res;
  res.counts.resize(static_cast<std::size_t>(world));
  std::mutex m;
  simulate(world, [&](RankContext& ctx) {
    Stage3Outcome o = stage3 ? dopt::testing::run_stage3(ctx.world(), run) : dopt::testing::run_stage1(ctx.world(), run);
    std::lock_guard<std::mutex> lock(m);
    if (ctx.rank() == 0) {
      for (const auto& p : o.params) res.params.push_back(bytes_of(p));
      res.state = state_bytes(o.state);
    }
    o.params.clear();
    o.state = StateDict();
    res.counts[static_cast<std::size_t>(ctx.rank())] = o;
  });
  return res;
}

Stage3Run base_run(const OptimizerSpec& spec) {
  Stage3Run run;
  run.spec = spec;
  run.shapes = {{7}, {13}, {4, 3}, {32}, {5}, {17}, {9}, {3, 2}};
  run.unit_sizes = {2, 1, 3, 2};
  return run;
}

void check_same_bits(const Stage3Run& run, int world) {
  const Result one = train(run, world, false);
  const Result three = train(run, world, true);
  REQUIRE(three.params.size() == run.shapes.size());
  CHECK(three.params == one.params);
  CHECK(!three.state.empty());
  CHECK(three.state == one.state);
}

}  // namespace

TEST_CASE("ZeRO stage 3 equals stage 1 with the Reducer bit for bit: Adam and SGD with momentum, world 1, 2, 3, 5",
          "[zero][zero3]") {
  for (const auto& spec : {spec_of(AdamOptions(0.01)), spec_of(SGDOptions(0.1).momentum(0.9))}) {
    for (int world : {1, 2, 3, 5}) {
      DYNAMIC_SECTION(spec.name << " world " << world) {
        check_same_bits(base_run(spec), world);
      }
    }
  }
}

TEST_CASE("ZeRO stage 3 with fp16_compress_hook equals stage 1 with the same hook bit for bit (world 1, 2, 3, 5)",
          "[zero][zero3]") {
  for (int world : {1, 2, 3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      Stage3Run run = base_run(spec_of(AdamOptions(0.01)));
      run.fp16 = true;
      check_same_bits(run, world);
    }
  }
}

TEST_CASE("ZeRO stage 3 refuses redundancy and Muon, and names the caller's errors with the call and the rank",
          "[zero][zero3]") {
  std::mutex m;
  std::vector<std::string> errors;
  simulate(2, [&](RankContext& ctx) {
    auto record = [&](const std::exception& e) {
      std::lock_guard<std::mutex> lock(m);
      errors.push_back(e.what());
    };
    const std::vector<std::vector<Tensor>> units{{Tensor::zeros({5}), Tensor::zeros({2, 3})}, {Tensor::zeros({4})}};
    try {
      ShardedUnits model(units, AdamOptions(0.01), ShardedUnitsOptions{.process_group = ctx.world(), .redundancy = 1});
    } catch (const NotSupportedError& e) {
      record(e);
    }
    try {
      ShardedUnits model(units, MuonOptions(), ShardedUnitsOptions{ctx.world()});
    } catch (const NotSupportedError& e) {
      record(e);
    }
    ShardedUnits model(units, AdamOptions(0.01), ShardedUnitsOptions{ctx.world()});
    const std::vector<Tensor> grads{Tensor::zeros({5}), Tensor::zeros({2, 3})};
    auto expect = [&](auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        record(e);
      }
    };
    expect([&] { model.step(); });                                      // no unit reduced
    expect([&] { (void)model.gather(5); });                             // no such unit
    expect([&] { model.reduce_gradients(0, {Tensor::zeros({5})}); });   // one gradient of two
    expect([&] { model.reduce_gradients(0, {Tensor::zeros({5}), Tensor::zeros({6})}); });  // wrong shape
    model.reduce_gradients(0, grads);
    expect([&] { model.reduce_gradients(0, grads); });                  // twice in one iteration
    expect([&] { model.register_comm_hook(fp16_compress_hook(ctx.world())); });  // after a reduction
    expect([&] { model.step(); });                                      // unit 1 not reduced
  });
  REQUIRE(errors.size() == 18);
  auto count = [&](std::initializer_list<const char*> parts) {
    int n = 0;
    for (const auto& e : errors) {
      bool all = true;
      for (const char* p : parts) all = all && e.find(p) != std::string::npos;
      n += all;
    }
    return n;
  };
  CHECK(count({"ShardedUnits", "redundancy 1", "not supported in stage 3"}) == 2);
  CHECK(count({"ShardedUnits", "Muon", "stages 1 and 2"}) == 2);
  CHECK(count({"ShardedUnits.step", "unit(s) 0, 1 have no reduced gradients"}) == 2);
  CHECK(count({"ShardedUnits.gather", "unit 5 is not one of the 2 units"}) == 2);
  CHECK(count({"ShardedUnits.reduce_gradients", "has 2 parameters, got 1 gradients"}) == 2);
  CHECK(count({"ShardedUnits.reduce_gradients", "gradient 1 has shape [6]"}) == 2);
  CHECK(count({"ShardedUnits.reduce_gradients", "unit 0 was reduced already"}) == 2);
  CHECK(count({"ShardedUnits.register_comm_hook", "reduced already"}) == 2);
  CHECK(count({"ShardedUnits.step", "unit(s) 1 have no reduced gradients"}) == 2);
  CHECK(count({"[rank 0]"}) == 9);
  CHECK(count({"[rank 1]"}) == 9);
}

TEST_CASE("ZeRO stage 3 keeps 16/N bytes per parameter with Adam and gathers at most two units: bytes, gathered_bytes",
          "[zero][zero3]") {
  for (int world : {1, 2, 3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      // 12 parameters of 500 floats in 6 units of 1000: 6000 parameters.
      Stage3Run run = base_run(spec_of(AdamOptions(0.01)));
      run.shapes.assign(12, Shape{500});
      run.unit_sizes.assign(6, 2);
      run.steps = 2;
      const Result three = train(run, world, true);
      const std::int64_t per_rank = 16 * 6000 / world;
      for (int r = 0; r < world; ++r) {
        INFO("rank " << r);
        const auto& n = three.counts[static_cast<std::size_t>(r)];
        // Shards of parameters, gradients, exp_avg and exp_avg_sq (padding
        // included) and one 4-byte step per unit.
        CHECK(n.bytes >= per_rank);
        CHECK(n.bytes <= per_rank * 105 / 100);
        // The current unit and the prefetched one, never more.
        CHECK(n.largest_unit >= 4000);
        CHECK(n.peak_gathered == 2 * n.largest_unit);
      }
    }
  }
}
