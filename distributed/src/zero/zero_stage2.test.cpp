// ZeRO stage 2 (the Reducer with zero_stage2_options, zero.hpp) against
// stage 1 (ZeroRedundancyOptimizer with a plain Reducer) over simulated
// ranks: the same final parameters, optimizer state and owned gradients, bit
// for bit (memcmp), at world sizes 1, 2, 3 and 5, for Adam, SGD with
// momentum and Muon (cost-weighted partition), with the fp16 hook against
// the same hook in stage 1, with no_sync accumulation and under Join with
// uneven inputs; the gradient bytes each rank keeps; the refusals. Rank
// functions only record; the test thread asserts after simulate() returned.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/optim/sgd.hpp"
#include "reference_data.hpp"
#include "zero_stage2_run.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

using dopt::testing::Stage2Run;
using Run = Stage2Run;

// What one rank ends with, as bytes (compared with ==: memcmp).
struct Result {
  std::vector<std::string> params, state, grads;
  dopt::testing::Stage2Outcome n;  // the counts (its tensors dropped)
};

std::string bytes_of(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.nbytes()));
}

std::vector<Result> train(const Run& run, int world, bool stage2) {
  std::vector<Result> out(world);
  simulate(world, [&](RankContext& ctx) {
    const auto o = dopt::testing::run_stage(ctx.world(), run, stage2);
    Result res;
    for (const auto& p : o.params) res.params.push_back(bytes_of(p));
    for (const auto& g : o.grads) res.grads.push_back(bytes_of(g));
    for (const auto& [idx, st] : o.state.state)
      for (const auto& [key, tensor] : st) res.state.push_back(std::to_string(idx) + key + bytes_of(tensor));
    res.n = o;
    res.n.params.clear();
    res.n.grads.clear();
    res.n.state = StateDict();
    out[ctx.rank()] = std::move(res);
  });
  return out;
}

Run base_run(const OptimizerSpec& spec) {
  Run run;
  run.spec = spec;
  run.shapes = {{7}, {13}, {4, 3}, {32}, {5}, {17}, {9}, {3, 2}};
  return run;
}

// Stage 2 equals stage 1 on every rank: parameters, state, owned gradients.
void check_same_bits(const Run& run, int world) {
  const auto one = train(run, world, false);
  const auto two = train(run, world, true);
  for (int r = 0; r < world; ++r) {
    INFO("world " << world << " rank " << r);
    CHECK(two[r].params == one[r].params);
    CHECK(two[r].state == one[r].state);
    CHECK(!two[r].state.empty());
    CHECK(two[r].grads == one[r].grads);
    CHECK(two[r].n.foreign_grads == 0);
  }
}

}  // namespace

TEST_CASE("ZeRO stage 2 equals stage 1 with the Reducer bit for bit: Adam and SGD with momentum, world 1, 2, 3, 5",
          "[zero][stage2]") {
  for (const auto& spec : {spec_of(AdamOptions(0.01)), spec_of(SGDOptions(0.1).momentum(0.9))}) {
    for (int world : {1, 2, 3, 5}) {
      DYNAMIC_SECTION(spec.name << " world " << world) {
        check_same_bits(base_run(spec), world);
      }
    }
  }
}

TEST_CASE("ZeRO stage 2 equals stage 1 bit for bit: Muon with the cost-weighted partition, world 1, 2, 3, 5",
          "[zero][stage2][muon]") {
  for (int world : {1, 2, 3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      Run run = base_run(spec_of(MuonOptions()));
      run.shapes = {{8, 12}, {12, 8}, {4, 4}, {6, 10}, {3, 5}, {16, 4}};
      run.weight = ZeroPartitionWeight::step_cost;
      check_same_bits(run, world);
    }
  }
}

TEST_CASE("ZeRO stage 2 with fp16_compress_hook equals stage 1 with the same hook bit for bit (world 1, 2, 3, 5)",
          "[zero][stage2]") {
  for (int world : {1, 2, 3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      Run run = base_run(spec_of(AdamOptions(0.01)));
      run.fp16 = true;
      check_same_bits(run, world);
    }
  }
}

TEST_CASE("ZeRO stage 2 with no_sync accumulation (3 micro-batches per step) equals stage 1 bit for bit",
          "[zero][stage2]") {
  for (int world : {2, 3}) {
    DYNAMIC_SECTION("world " << world) {
      Run run = base_run(spec_of(SGDOptions(0.1).momentum(0.9)));
      run.micro = 3;
      check_same_bits(run, world);
    }
  }
}

TEST_CASE("ZeRO stage 2 under Join with uneven inputs (rank r runs 4 - r steps) equals stage 1 bit for bit",
          "[zero][stage2][join]") {
  for (int world : {2, 3}) {
    DYNAMIC_SECTION("world " << world) {
      Run run = base_run(spec_of(AdamOptions(0.01)));
      run.steps = 4;
      run.join = true;
      check_same_bits(run, world);
    }
  }
}

TEST_CASE("ZeRO stage 2 keeps the owned gradients and one bucket between iterations: Reducer::gradient_bytes",
          "[zero][stage2]") {
  for (int world : {2, 3, 5}) {
    DYNAMIC_SECTION("world " << world) {
      // 15 parameters of 16 floats, one per bucket: 15 buckets of 64 bytes.
      Run run = base_run(spec_of(AdamOptions(0.01)));
      run.shapes.assign(15, Shape{16});
      const auto one = train(run, world, false);
      const auto two = train(run, world, true);
      std::int64_t sum_owned = 0;
      for (int r = 0; r < world; ++r) {
        INFO("rank " << r);
        // Stage 1: every gradient and every bucket buffer.
        CHECK(one[r].n.gradient_bytes == 2 * one[r].n.total_bytes);
        // Stage 2: the owned gradients and at most one bucket (the spare
        // buffer the next iteration starts with).
        CHECK(two[r].n.gradient_bytes >= two[r].n.owned_bytes);
        CHECK(two[r].n.gradient_bytes <= two[r].n.owned_bytes + two[r].n.largest_bucket);
        CHECK(two[r].n.gradient_bytes < one[r].n.gradient_bytes);
        // During the backward: the owned gradients and at most three buffers
        // (the spare, then two in use: a third waits for a launched bucket).
        CHECK(two[r].n.peak_gradient_bytes <= two[r].n.owned_bytes + 3 * two[r].n.largest_bucket);
        CHECK(one[r].n.peak_gradient_bytes == 2 * one[r].n.total_bytes);
        sum_owned += two[r].n.owned_bytes;
      }
      CHECK(sum_owned == two[0].n.total_bytes);
    }
  }
}

TEST_CASE("ZeRO stage 2 refuses redundancy, survive, a parameter the optimizer does not hold and bad owners, naming the call",
          "[zero][stage2]") {
  std::mutex m;
  std::vector<std::string> errors;
  simulate(2, [&](RankContext& ctx) {
    auto ps = dopt::testing::uneven_params(4, 5, 3, 7);
    auto record = [&](const std::exception& e) {
      std::lock_guard<std::mutex> lock(m);
      errors.push_back(e.what());
    };
    {
      ZeroOptions zo;
      zo.process_group = ctx.world();
      zo.redundancy = 1;
      ZeroRedundancyOptimizer zero(ps, AdamOptions(0.01), zo);
      try {
        (void)zero_stage2_options(zero, ps);
      } catch (const NotSupportedError& e) {
        record(e);
      }
    }
    ZeroRedundancyOptimizer zero(ps, AdamOptions(0.01), ZeroOptions{ctx.world()});
    try {
      (void)zero_stage2_options(zero, ps, ReducerOptions{.survive = true});
    } catch (const NotSupportedError& e) {
      record(e);
    }
    auto more = ps;
    more.push_back(Tensor::zeros({3}));
    try {
      (void)zero_stage2_options(zero, more);
    } catch (const ValueError& e) {
      record(e);
    }
    for (const auto& owners : {std::vector<int>{0, 1, 0}, std::vector<int>{0, 1, 2, 0}}) {
      try {
        Reducer red(ps, ctx.world(), ReducerOptions{.gradient_owners = owners});
      } catch (const ValueError& e) {
        record(e);
      }
    }
  });
  REQUIRE(errors.size() == 10);
  int redundancy = 0, survive = 0, foreign = 0, count = 0, range = 0;
  for (const auto& e : errors) {
    redundancy += e.find("zero_stage2_options") != std::string::npos && e.find("redundancy 1") != std::string::npos;
    survive += e.find("zero_stage2_options") != std::string::npos && e.find("survive") != std::string::npos;
    foreign += e.find("zero_stage2_options") != std::string::npos && e.find("parameter 4") != std::string::npos &&
               e.find("not one of the optimizer's") != std::string::npos;
    count += e.find("Reducer") != std::string::npos && e.find("3 entries for 4 parameters") != std::string::npos;
    range += e.find("Reducer") != std::string::npos && e.find("gradient_owners[2] = 2") != std::string::npos;
  }
  CHECK(redundancy == 2);
  CHECK(survive == 2);
  CHECK(foreign == 2);
  CHECK(count == 2);
  CHECK(range == 2);
}

namespace {

// One leg of a run that moves between checkpoints: `world` simulated ranks
// in stage 1 or 2 start from `start` (the parameters) and, when `from` is
// given, the optimizer state save_sharded wrote there at another world size
// and stage; they train steps t0..t1-1 and save_sharded to `to`. Returns
// rank 0's parameters and, by rank, the local optimizer's state as bytes.
struct Leg {
  std::vector<Tensor> params;
  std::vector<std::vector<std::string>> state;
};

Leg leg(const Run& run, int world, bool stage2, const std::vector<Tensor>& start, const std::string& from,
        const std::string& to, int t0, int t1) {
  Leg out;
  out.state.resize(static_cast<std::size_t>(world));
  std::mutex m;
  simulate(world, [&](RankContext& ctx) {
    const int r = ctx.rank();
    std::vector<Tensor> ps;
    for (const auto& p : start) ps.push_back(p.clone());
    ZeroOptions zo;
    zo.process_group = ctx.world();
    ZeroRedundancyOptimizer zero(ps, run.spec, zo);
    if (!from.empty()) zero.load_sharded(from);
    const ReducerOptions ro{.bucket_cap_bytes = run.bucket_cap_bytes,
                            .first_bucket_cap_bytes = run.first_bucket_cap_bytes};
    Reducer red(ps, ctx.world(), stage2 ? zero_stage2_options(zero, ps, ro) : ro);
    for (int t = t0; t < t1; ++t) {
      zero.zero_grad(true);
      for (std::size_t k = ps.size(); k-- > 0;) {
        ps[k].set_grad(dopt::testing::stage2_grad(run.shapes[k], r, t, 0, k));
        red.mark_ready(ps[k]);
      }
      red.finalize();
      zero.step();
    }
    zero.save_sharded(to);
    std::vector<std::string> st;
    for (const auto& [idx, s] : zero.optim().state_dict().state)
      for (const auto& [key, tensor] : s) st.push_back(std::to_string(idx) + key + bytes_of(tensor));
    std::lock_guard<std::mutex> lock(m);
    out.state[static_cast<std::size_t>(r)] = std::move(st);
    if (r == 0)
      for (const auto& p : ps) out.params.push_back(p.clone());
  });
  return out;
}

std::string stage_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const auto d = fs::temp_directory_path() / ("dopt-zero-stage2-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  return d.string();
}

}  // namespace

TEST_CASE("ZeRO checkpoints move between stages 1 and 2 and world sizes 3, 5 and 2 bit for bit",
          "[zero][stage2][checkpoint]") {
  // The same run twice: 3 ranks (2 steps), save, 5 ranks (2 steps), save,
  // 2 ranks (2 steps); once in stage 1 throughout, once switching stage at
  // every checkpoint (2, 1, 2). The state each rank holds at the end and the
  // parameters are equal: a checkpoint does not depend on the stage.
  const Run run = base_run(spec_of(AdamOptions(0.01)));
  std::vector<Tensor> init;
  for (std::size_t i = 0; i < run.shapes.size(); ++i)
    init.push_back(Tensor::from_vector(
        dopt::testing::values<float>(static_cast<std::size_t>(shape_numel(run.shapes[i])), 60 + i), run.shapes[i]));
  auto three_legs = [&](const std::vector<bool>& stage2, const std::string& tag) {
    const std::string a = stage_dir(tag + "a"), b = stage_dir(tag + "b"), c = stage_dir(tag + "c");
    const Leg l3 = leg(run, 3, stage2[0], init, "", a, 0, 2);
    const Leg l5 = leg(run, 5, stage2[1], l3.params, a, b, 2, 4);
    Leg l2 = leg(run, 2, stage2[2], l5.params, b, c, 4, 6);
    for (const auto& d : {a, b, c}) std::filesystem::remove_all(d);
    return l2;
  };
  const Leg one = three_legs({false, false, false}, "one");
  const Leg mixed = three_legs({true, false, true}, "mixed");
  REQUIRE(one.params.size() == init.size());
  for (std::size_t k = 0; k < init.size(); ++k) {
    INFO("parameter " << k);
    CHECK(bytes_of(mixed.params[k]) == bytes_of(one.params[k]));
    CHECK(bytes_of(one.params[k]) != bytes_of(init[k]));  // it trained
  }
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(!one.state[r].empty());
    CHECK(mixed.state[r] == one.state[r]);
  }
}
