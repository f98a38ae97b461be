// ZeRO stage 3 (ShardedUnits, zero_stage3.hpp) against stage 1
// (ZeroRedundancyOptimizer with a Reducer) over simulated ranks: the same
// final parameters and consolidated optimizer state, bit for bit (memcmp),
// at world sizes 1, 2, 3 and 5, for Adam and SGD with momentum, with the
// fp16 hook against the same hook in stage 1; the bytes each rank keeps;
// the refusals and the caller's errors; checkpoints between stages and world
// sizes. Rank functions only record; the test thread asserts after
// simulate() returned.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/runtime/state_dict.hpp"
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

// A state dict as bytes: "index.key bytes" per tensor, in order.
std::vector<std::string> state_bytes(const StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : dopt::testing::named_state(sd)) out.push_back(name + " " + bytes_of(tensor));
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
    Stage3Outcome o =
        stage3 ? dopt::testing::run_stage3(ctx.world(), run) : dopt::testing::run_stage1(ctx.world(), run);
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

Stage3Run base_run(const OptimizerSpec& spec) { return dopt::testing::small_stage3_run(spec); }

void check_same_bits(const Stage3Run& run, int world) {
  const Result one = train(run, world, false);
  const Result three = train(run, world, true);
  REQUIRE(three.params.size() == run.shapes.size());
  CHECK(three.params == one.params);
  CHECK(!three.state.empty());
  CHECK(three.state == one.state);
}

// check_same_bits at each world size, a section each.
void at_worlds(const Stage3Run& run, std::initializer_list<int> worlds) {
  for (int world : worlds)
    DYNAMIC_SECTION(run.spec.name << " world " << world) { check_same_bits(run, world); }
}

// The in-place path (gradient_buffers, or release_for_gradients with
// `from_gathered`, and reduce_gradients(u)) against the copying path and
// stage 1, bit for bit.
void check_in_place(Stage3Run run, int world, bool from_gathered = false) {
  run.in_place = false;
  const Result copying = train(run, world, true);
  const Result one = train(run, world, false);
  run.in_place = true;
  run.from_gathered = from_gathered;
  const Result in_place = train(run, world, true);
  REQUIRE(in_place.params.size() == run.shapes.size());
  CHECK(in_place.params == copying.params);
  CHECK(in_place.params == one.params);
  CHECK(!in_place.state.empty());
  CHECK(in_place.state == copying.state);
  CHECK(in_place.state == one.state);
}

Stage3Run adam_with(bool async, bool fp16) {
  Stage3Run run = base_run(spec_of(AdamOptions(0.01)));
  run.async = async;
  run.fp16 = fp16;
  return run;
}

// The units of the misuse tests: [5] and [2, 3] filled with a and b, then [4]
// filled with c.
std::vector<std::vector<Tensor>> two_units(double a, double b, double c) {
  return {{Tensor::full({5}, a), Tensor::full({2, 3}, b)}, {Tensor::full({4}, c)}};
}

// How many of `errors` hold every one of `parts`.
int errors_with(const std::vector<std::string>& errors, std::initializer_list<const char*> parts) {
  int n = 0;
  for (const auto& e : errors) {
    bool all = true;
    for (const char* p : parts) all = all && e.find(p) != std::string::npos;
    n += all;
  }
  return n;
}

// Runs a call that must throw a StateError and keeps its message (a call that
// does not throw adds none, which the count of messages shows).
struct ExpectStateError {
  std::vector<std::string>* messages;
  template <class Call>
  void operator()(Call&& call) const {
    try {
      call();
    } catch (const StateError& e) {
      messages->push_back(e.what());
    }
  }
};

struct MisuseResult {
  std::vector<std::string> errors;                // the StateErrors of both ranks
  std::map<std::string, std::vector<int>> found;  // each of the body's checks: one entry per rank, 1 when true
};

// Two simulated ranks, each with a ShardedUnits (Adam) over two_units(a, b,
// c), run body(model, expect): it makes the calls that must throw through
// expect and returns its checks by name.
template <class Body>
MisuseResult misuse_on_two_ranks(double a, double b, double c, Body body) {
  MisuseResult res;
  std::mutex m;
  simulate(2, [&](RankContext& ctx) {
    ShardedUnits model(two_units(a, b, c), AdamOptions(0.01), ShardedUnitsOptions{ctx.world()});
    std::vector<std::string> mine;
    const std::vector<std::pair<std::string, bool>> checks = body(model, ExpectStateError{&mine});
    std::lock_guard<std::mutex> lock(m);
    res.errors.insert(res.errors.end(), mine.begin(), mine.end());
    for (const auto& [name, ok] : checks) res.found[name].push_back(ok);
  });
  return res;
}

}  // namespace

TEST_CASE("ZeRO stage 3 equals stage 1 with the Reducer bit for bit: Adam and SGD with momentum, world 1, 2, 3, 5",
          "[zero][zero3]") {
  at_worlds(base_run(spec_of(AdamOptions(0.01))), {1, 2, 3, 5});
  at_worlds(base_run(spec_of(SGDOptions(0.1).momentum(0.9))), {1, 2, 3, 5});
}

TEST_CASE("ZeRO stage 3 with gather_async and reduce_gradients_async equals stage 1 bit for bit (world 2, 3, 5)",
          "[zero][zero3]") {
  at_worlds(adam_with(/*async=*/true, /*fp16=*/false), {2, 3, 5});
}

TEST_CASE("ZeRO stage 3 with fp16_compress_hook equals stage 1 with the same hook bit for bit (world 1, 2, 3, 5)",
          "[zero][zero3]") {
  at_worlds(adam_with(/*async=*/false, /*fp16=*/true), {1, 2, 3, 5});
}

TEST_CASE("ZeRO stage 3 gradient_buffers with reduce_gradients(u) equals the copying path and stage 1 bit for bit",
          "[zero][zero3]") {
  for (const OptimizerSpec& spec : {spec_of(AdamOptions(0.01)), spec_of(SGDOptions(0.1).momentum(0.9))})
    for (bool async : {false, true})
      for (int world : {1, 2, 3, 5})
        DYNAMIC_SECTION(spec.name << (async ? " async" : " sync") << " world " << world) {
          Stage3Run run = base_run(spec);
          run.async = async;
          check_in_place(run, world);
        }
  SECTION("fp16_compress_hook world 3") {
    Stage3Run run = adam_with(/*async=*/true, /*fp16=*/true);
    check_in_place(run, 3);
  }
}

TEST_CASE("ZeRO stage 3 release_for_gradients (gradients in the gathered memory) equals copying and stage 1 bitwise",
          "[zero][zero3]") {
  for (const OptimizerSpec& spec : {spec_of(AdamOptions(0.01)), spec_of(SGDOptions(0.1).momentum(0.9))})
    for (bool async : {false, true})
      for (int world : {1, 2, 3, 5})
        DYNAMIC_SECTION(spec.name << (async ? " async" : " sync") << " world " << world) {
          Stage3Run run = base_run(spec);
          run.async = async;
          check_in_place(run, world, /*from_gathered=*/true);
        }
  SECTION("fp16_compress_hook world 3 and 5") {
    for (int world : {3, 5}) check_in_place(adam_with(/*async=*/true, /*fp16=*/true), world, /*from_gathered=*/true);
  }
}

TEST_CASE("ZeRO stage 3 release_for_gradients: the gathered buffer, zeroed, and the caller's misuse as StateErrors",
          "[zero][zero3]") {
  const MisuseResult got = misuse_on_two_ranks(1.0, 2.0, 3.0, [](ShardedUnits& model, const ExpectStateError& expect) {
    expect([&] { (void)model.release_for_gradients(0); });  // not gathered
    const std::vector<Tensor> full = model.gather(0);
    const void* gathered_at = full[0].data_ptr();
    const std::int64_t unit_bytes = model.gathered_bytes();  // 12 floats (11 and padding)
    const bool values = full[1].to_vector<float>() == std::vector<float>(6, 2.0f);
    std::vector<Tensor> g = model.release_for_gradients(0);
    const bool is_zero = values && g.size() == 2 && g[1].shape() == Shape{2, 3} &&
                         g[0].to_vector<float>() == std::vector<float>(5, 0.0f) &&
                         g[1].to_vector<float>() == std::vector<float>(6, 0.0f);
    // The gradients are the parameters' memory: the unit is released, the
    // buffer counted once.
    const bool same = g[0].data_ptr() == gathered_at;
    const bool gone = model.gathered_bytes() == 0 && model.buffer_bytes() == unit_bytes;
    g[1].fill_(4.0);
    const std::vector<Tensor> again = model.release_for_gradients(0), through = model.gradient_buffers(0);
    const bool values_kept = again[1].data_ptr() == g[1].data_ptr() && through[1].data_ptr() == g[1].data_ptr() &&
                             again[1].to_vector<float>() == std::vector<float>(6, 4.0f);
    expect([&] { model.reduce_gradients(0, {Tensor::zeros({5}), Tensor::zeros({2, 3})}); });  // buffers are out
    (void)model.reduce_gradients_async(0);
    expect([&] { (void)model.release_for_gradients(0); });  // reduced already
    (void)model.gather(1);
    (void)model.gradient_buffers(1);
    expect([&] { (void)model.release_for_gradients(1); });  // gradient_buffers of their own are out
    model.reduce_gradients(1);
    const bool count_after = model.buffer_bytes() > 0;  // the spares, until step()
    model.step();
    return std::vector<std::pair<std::string, bool>>{{"same memory", same},
                                                     {"zeros", is_zero},
                                                     {"kept", values_kept},
                                                     {"released", gone},
                                                     {"counted", count_after && model.buffer_bytes() == 0}};
  });
  CHECK(got.found.at("same memory") == std::vector<int>{1, 1});
  CHECK(got.found.at("zeros") == std::vector<int>{1, 1});
  CHECK(got.found.at("kept") == std::vector<int>{1, 1});
  CHECK(got.found.at("released") == std::vector<int>{1, 1});
  CHECK(got.found.at("counted") == std::vector<int>{1, 1});
  REQUIRE(got.errors.size() == 8);
  CHECK(errors_with(got.errors, {"ShardedUnits.release_for_gradients", "unit 0 is not gathered"}) == 2);
  CHECK(errors_with(got.errors, {"ShardedUnits.reduce_gradients", "gradient_buffers are out"}) == 2);
  CHECK(errors_with(got.errors, {"ShardedUnits.release_for_gradients", "unit 0 was reduced already"}) == 2);
  CHECK(errors_with(got.errors, {"ShardedUnits.release_for_gradients", "unit 1's gradient_buffers are out"}) == 2);
  CHECK(errors_with(got.errors, {"[rank 0]"}) == 4);
  CHECK(errors_with(got.errors, {"[rank 1]"}) == 4);
}

TEST_CASE("ZeRO stage 3 gradient_buffers: the caller's misuse is a StateError naming the call and the rank",
          "[zero][zero3]") {
  const MisuseResult got = misuse_on_two_ranks(0.0, 0.0, 0.0, [](ShardedUnits& model, const ExpectStateError& expect) {
    expect([&] { model.reduce_gradients(0); });  // no gradient_buffers taken
    auto bufs = model.gradient_buffers(0);
    const bool zeros = bufs.size() == 2 && bufs[1].shape() == Shape{2, 3} &&
                       bufs[0].to_vector<float>() == std::vector<float>(5, 0.0f) &&
                       bufs[1].to_vector<float>() == std::vector<float>(6, 0.0f);
    bufs[1].fill_(2.0);
    auto again = model.gradient_buffers(0);  // the same buffer, values kept
    const bool same =
        again[1].data_ptr() == bufs[1].data_ptr() && again[1].to_vector<float>() == std::vector<float>(6, 2.0f);
    expect([&] { model.reduce_gradients(0, {Tensor::zeros({5}), Tensor::zeros({2, 3})}); });  // buffers are out
    (void)model.reduce_gradients_async(0);
    expect([&] { (void)model.gradient_buffers(0); });  // reduced already
    expect([&] { model.reduce_gradients(0); });        // twice
    model.reduce_gradients(1, {Tensor::zeros({4})});
    model.step();
    return std::vector<std::pair<std::string, bool>>{{"same buffer", same}, {"zeros at first", zeros}};
  });
  CHECK(got.found.at("same buffer") == std::vector<int>{1, 1});
  CHECK(got.found.at("zeros at first") == std::vector<int>{1, 1});
  REQUIRE(got.errors.size() == 8);
  CHECK(errors_with(got.errors, {"ShardedUnits.reduce_gradients", "unit 0 has no gradient_buffers"}) == 2);
  CHECK(errors_with(got.errors, {"ShardedUnits.reduce_gradients", "gradient_buffers are out"}) == 2);
  CHECK(errors_with(got.errors, {"ShardedUnits.gradient_buffers", "unit 0 was reduced already"}) == 2);
  CHECK(errors_with(got.errors, {"ShardedUnits.reduce_gradients", "unit 0 was reduced already"}) == 2);
  CHECK(errors_with(got.errors, {"[rank 0]"}) == 4);
  CHECK(errors_with(got.errors, {"[rank 1]"}) == 4);
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
    const std::vector<std::vector<Tensor>> units = two_units(0.0, 0.0, 0.0);
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
  CHECK(errors_with(errors, {"ShardedUnits", "redundancy 1", "not supported in stage 3"}) == 2);
  CHECK(errors_with(errors, {"ShardedUnits", "Muon", "stages 1 and 2"}) == 2);
  CHECK(errors_with(errors, {"ShardedUnits.step", "unit(s) 0, 1 have no reduced gradients"}) == 2);
  CHECK(errors_with(errors, {"ShardedUnits.gather", "unit 5 is not one of the 2 units"}) == 2);
  CHECK(errors_with(errors, {"ShardedUnits.reduce_gradients", "has 2 parameters, got 1 gradients"}) == 2);
  CHECK(errors_with(errors, {"ShardedUnits.reduce_gradients", "gradient 1 has shape [6]"}) == 2);
  CHECK(errors_with(errors, {"ShardedUnits.reduce_gradients", "unit 0 was reduced already"}) == 2);
  CHECK(errors_with(errors, {"ShardedUnits.register_comm_hook", "reduced already"}) == 2);
  CHECK(errors_with(errors, {"ShardedUnits.step", "unit(s) 1 have no reduced gradients"}) == 2);
  CHECK(errors_with(errors, {"[rank 0]"}) == 9);
  CHECK(errors_with(errors, {"[rank 1]"}) == 9);
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
        // Besides them, the reduce buffer of the unit in the backward.
        CHECK(n.peak_buffers == 3 * n.largest_unit);
      }
      // The gradients in the gathered memory (release_for_gradients, then
      // the prefetch): two unit buffers in all, the same bytes kept.
      run.in_place = true;
      run.from_gathered = true;
      const Result two = train(run, world, true);
      for (int r = 0; r < world; ++r) {
        INFO("rank " << r << ", release_for_gradients");
        const auto& n = two.counts[static_cast<std::size_t>(r)];
        CHECK(n.bytes == three.counts[static_cast<std::size_t>(r)].bytes);
        CHECK(n.peak_gathered == 2 * n.largest_unit);
        CHECK(n.peak_buffers == 2 * n.largest_unit);
      }
    }
  }
}

namespace {

// One leg of a run that moves between checkpoints: `world` simulated ranks
// in stage 1, 2 or 3 start from `start` (every parameter; stage 3 loads
// them with load_parameters) and, when `from` is given, the consolidated
// state dict in that file (saved by a leg at another world size and stage);
// they train steps t0..t1-1 and rank 0 saves the consolidated state dict to
// `to`. Returns rank 0's parameters.
std::vector<Tensor> leg(const Stage3Run& run, int world, int stage, const std::vector<Tensor>& start,
                        const std::string& from, const std::string& to, int t0, int t1) {
  std::vector<Tensor> out;
  simulate(world, [&](RankContext& ctx) {
    std::vector<Tensor> full;
    StateDict sd;
    if (stage == 3) {
      std::vector<std::vector<Tensor>> units;
      std::size_t k = 0;
      for (std::size_t n : run.unit_sizes) {
        units.emplace_back();
        for (std::size_t i = 0; i < n; ++i, ++k) units.back().push_back(Tensor::zeros(start[k].shape()));
      }
      ShardedUnits model(units, run.spec, ShardedUnitsOptions{ctx.world()});
      model.load_parameters(start);  // the parameters of the checkpoint
      if (!from.empty()) model.load_state_dict(load_state_dict(from));
      std::int64_t peak = 0;
      for (int t = t0; t < t1; ++t) dopt::testing::stage3_iteration(model, run, t, peak);
      full = model.full_parameters();
      sd = model.state_dict();
    } else {
      for (const auto& p : start) full.push_back(p.clone());
      ZeroRedundancyOptimizer zero(full, run.spec, ZeroOptions{ctx.world()});
      if (!from.empty()) zero.load_state_dict(from);
      const ReducerOptions ro{.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 24};
      Reducer red(full, ctx.world(), stage == 2 ? zero_stage2_options(zero, full, ro) : ro);
      for (int t = t0; t < t1; ++t) {
        zero.zero_grad(true);
        for (std::size_t k = full.size(); k-- > 0;) {
          full[k].set_grad(dopt::testing::stage2_grad(run.shapes[k], ctx.rank(), t, 0, k));
          red.mark_ready(full[k]);
        }
        red.finalize();
        zero.step();
      }
      zero.consolidate_state_dict(0);
      if (ctx.rank() == 0) sd = zero.state_dict();
    }
    if (ctx.rank() == 0) {
      save_state_dict(sd, to);
      for (const auto& p : full) out.push_back(p.clone());
    }
  });
  return out;
}

std::string checkpoint_file(const std::string& name) {
  namespace fs = std::filesystem;
  const auto d = fs::temp_directory_path() /
                 ("dopt-zero-stage3-test-" + std::to_string(::getpid()) + "-" + name + ".safetensors");
  fs::remove(d);
  return d.string();
}

}  // namespace

TEST_CASE("ZeRO checkpoints move between stage 3 and stages 1, 2 and world sizes 3, 5 and 2 bit for bit",
          "[zero][zero3][checkpoint]") {
  // The same run three times: 3 ranks (2 steps), save, 5 ranks (2 steps),
  // save, 2 ranks (2 steps), save; in stage 1 throughout, then in stages
  // 3, 1, 3 and in stages 3, 2, 3. The checkpoints are consolidated state
  // dicts (torch's layout) in files; the final parameters and state are equal.
  const Stage3Run run = base_run(spec_of(AdamOptions(0.01)));
  std::vector<Tensor> init;
  for (std::size_t k = 0; k < run.shapes.size(); ++k) init.push_back(dopt::testing::stage3_param(run.shapes[k], k));
  struct End {
    std::vector<std::string> params, state;
  };
  auto three_legs = [&](const std::vector<int>& stages, const std::string& tag) {
    const std::string a = checkpoint_file(tag + "a"), b = checkpoint_file(tag + "b"), c = checkpoint_file(tag + "c");
    const auto p3 = leg(run, 3, stages[0], init, "", a, 0, 2);
    const auto p5 = leg(run, 5, stages[1], p3, a, b, 2, 4);
    const auto p2 = leg(run, 2, stages[2], p5, b, c, 4, 6);
    End end;
    for (const auto& p : p2) end.params.push_back(bytes_of(p));
    end.state = state_bytes(load_state_dict(c));
    for (const auto& f : {a, b, c}) std::filesystem::remove(f);
    return end;
  };
  const End one = three_legs({1, 1, 1}, "one");
  REQUIRE(one.params.size() == init.size());
  for (std::size_t k = 0; k < init.size(); ++k) CHECK(one.params[k] != bytes_of(init[k]));  // it trained
  CHECK(!one.state.empty());
  for (const auto& stages : {std::vector<int>{3, 1, 3}, std::vector<int>{3, 2, 3}}) {
    DYNAMIC_SECTION("stages " << stages[0] << stages[1] << stages[2]) {
      const End mixed = three_legs(stages, "mixed");
      CHECK(mixed.params == one.params);
      CHECK(mixed.state == one.state);
    }
  }
}
