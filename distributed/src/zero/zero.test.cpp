// ZeroRedundancyOptimizer over simulated ranks. Rank functions record what
// they found (no Catch assertions on rank threads); the test thread asserts
// after simulate() returned. Results are compared bitwise against a plain
// local optimizer fed the same averaged gradients, computed here
// independently (ZeRO runs the same kernels, so the bits must match).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "dopt/actors/join.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/optim/internal/state_check.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "bitwise_checks.hpp"
#include "reference_data.hpp"
#include "sim_timeout.hpp"

using namespace dopt;
using namespace dopt::optim;
namespace fs = std::filesystem;

namespace {

SimulateOptions short_timeout() { return dopt::testing::with_timeout(std::chrono::seconds(30)); }

Tensor init_value(std::size_t i, const Shape& s, DType dt) {
  auto v = dopt::testing::values<double>(static_cast<std::size_t>(shape_numel(s)), 7 + i);
  return Tensor::from_vector(v, s).to(dt);
}

Tensor grad_value(int t, int r, std::size_t i, const Shape& s, DType dt) {
  auto v = dopt::testing::values<double>(static_cast<std::size_t>(shape_numel(s)),
                                100000 + 1000 * static_cast<std::uint64_t>(t) + 37 * static_cast<std::uint64_t>(r) + i,
                                2.0);
  return Tensor::from_vector(v, s).to(dt);
}

// In place: g / W in g's dtype (what every rank does after all_reduce(sum)).
void divide_(const Tensor& g, int w) {
  if (g.dtype() == DType::float32) {
    float* d = g.data<float>();
    for (std::int64_t k = 0; k < g.numel(); ++k) d[k] = d[k] / static_cast<float>(w);
  } else {
    double* d = g.data<double>();
    for (std::int64_t k = 0; k < g.numel(); ++k) d[k] = d[k] / static_cast<double>(w);
  }
}

// a += b in a's dtype.
void add_(const Tensor& a, const Tensor& b) {
  if (a.dtype() == DType::float32) {
    float* d = a.data<float>();
    const float* s = b.data<float>();
    for (std::int64_t k = 0; k < a.numel(); ++k) d[k] = d[k] + s[k];
  } else {
    double* d = a.data<double>();
    const double* s = b.data<double>();
    for (std::int64_t k = 0; k < a.numel(); ++k) d[k] = d[k] + s[k];
  }
}

struct Scenario {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;                      // empty: all float32
  std::vector<std::vector<std::size_t>> groups;   // parameter indices per group
  std::vector<Hyperparams> overrides;             // per group (may be shorter)
  OptimizerSpec spec;
  std::set<std::size_t> frozen;                   // requires_grad false, never a grad
  std::function<bool(int, std::size_t)> has_grad; // null: always
  int unfreeze_at = -1;                           // frozen params become trainable at this step
  bool bucket_view = false;
  bool add_last_group_later = false;

  DType dt(std::size_t i) const { return dtypes.empty() ? DType::float32 : dtypes[i]; }
  std::size_t n() const { return shapes.size(); }
  bool frozen_at(int t, std::size_t i) const { return frozen.count(i) && (unfreeze_at < 0 || t < unfreeze_at); }
  bool grad_at(int t, std::size_t i) const { return !frozen_at(t, i) && (!has_grad || has_grad(t, i)); }
};

Scenario base_scenario(const std::string& optimizer) {
  Scenario s;
  s.shapes = {{5}, {9}, {9}, {3}, {7}, {1}, {7}, {4, 3}, {}};
  s.groups = {{0, 1, 2, 3, 4}, {5, 6, 7, 8}};
  if (optimizer == "Adam") {
    s.spec = OptimizerSpec{"Adam", {{"lr", 0.01}, {"weight_decay", 0.1}}};
    s.overrides = {{{"lr", 0.05}}, {}};
  } else if (optimizer == "NAdam" || optimizer == "RAdam") {
    s.spec = OptimizerSpec{optimizer, {{"lr", 0.01}, {"weight_decay", 0.1}}};
    s.overrides = {{{"lr", 0.05}}, {}};
  } else {
    s.spec = OptimizerSpec{"SGD", {{"lr", 0.1}, {"momentum", 0.9}}};
    s.overrides = {{}, {{"lr", 0.02}, {"nesterov", true}}};
  }
  s.frozen = {3};
  s.has_grad = [](int t, std::size_t i) { return !(i == 6 && t == 1); };
  return s;
}

std::vector<OptimizerParamGroup> make_groups(const Scenario& s, const std::vector<Tensor>& params, std::size_t first,
                                             std::size_t last) {
  std::vector<OptimizerParamGroup> out;
  for (std::size_t g = first; g < last; ++g) {
    std::vector<Tensor> ps;
    for (auto i : s.groups[g]) ps.push_back(params[i]);
    Hyperparams h = s.spec.hyperparameters;
    if (g < s.overrides.size())
      for (const auto& [k, v] : s.overrides[g]) h[k] = v;
    out.emplace_back(std::move(ps), make_options(OptimizerSpec{s.spec.name, h}));
  }
  return out;
}

std::vector<Tensor> initial_params(const Scenario& s) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < s.n(); ++i) {
    ps.push_back(init_value(i, s.shapes[i], s.dt(i)));
    if (s.frozen.count(i)) ps.back().set_requires_grad(false);
  }
  return ps;
}

// The gradient of param i at step t that every rank holds after averaging:
// the ranks' gradients summed in rank order (active ranks only; the others
// add zeros), divided by the world size.
Tensor averaged_grad(const Scenario& s, int t, std::size_t i, int world, int active = -1) {
  if (active < 0) active = world;
  Tensor acc;
  for (int r = 0; r < world; ++r) {
    Tensor g = r < active ? grad_value(t, r, i, s.shapes[i], s.dt(i)) : Tensor::zeros(s.shapes[i], s.dt(i));
    if (!acc.defined()) acc = g;
    else add_(acc, g);
  }
  divide_(acc, world);
  return acc;
}

// A plain optimizer over the same groups, params[t][i] after step t (t in [0, steps)).
struct Reference {
  std::vector<std::vector<Tensor>> params;
  StateDict final_state;
};

Reference reference(const Scenario& s, int world, int steps) {
  auto params = initial_params(s);
  auto opt = make_optimizer(s.spec, make_groups(s, params, 0, s.groups.size()));
  Reference ref;
  for (int t = 0; t < steps; ++t) {
    for (std::size_t i = 0; i < s.n(); ++i) {
      if (t == s.unfreeze_at && s.frozen.count(i)) params[i].set_requires_grad(true);
      params[i].set_grad(s.grad_at(t, i) ? averaged_grad(s, t, i, world) : Tensor());
    }
    opt->step();
    std::vector<Tensor> snap;
    for (const auto& p : params) snap.push_back(p.clone());
    ref.params.push_back(std::move(snap));
  }
  ref.final_state = opt->state_dict();
  return ref;
}

// On a rank: sets every param's grad for step t to the average over the
// ranks, through all_reduce(sum) and a division.
void set_averaged_grads(const Scenario& s, RankContext& ctx, const std::vector<Tensor>& params, int t) {
  for (std::size_t i = 0; i < s.n(); ++i) {
    if (t == s.unfreeze_at && s.frozen.count(i)) params[i].set_requires_grad(true);
    if (!s.grad_at(t, i)) {
      params[i].set_grad(Tensor());
      continue;
    }
    Tensor g = grad_value(t, ctx.rank(), i, s.shapes[i], s.dt(i));
    ctx.world().all_reduce(g, ReduceOp::sum);
    divide_(g, ctx.world_size());
    params[i].set_grad(g);
  }
}

std::unique_ptr<ZeroRedundancyOptimizer> make_zero(const Scenario& s, RankContext& ctx,
                                                   const std::vector<Tensor>& params) {
  ZeroOptions o;
  o.process_group = ctx.world();
  o.parameters_as_bucket_view = s.bucket_view;
  const std::size_t ng = s.groups.size();
  if (!s.add_last_group_later)
    return std::make_unique<ZeroRedundancyOptimizer>(make_groups(s, params, 0, ng), s.spec, o);
  auto z = std::make_unique<ZeroRedundancyOptimizer>(make_groups(s, params, 0, ng - 1), s.spec, o);
  z->add_param_group(make_groups(s, params, ng - 1, ng).front());
  return z;
}

/// make_zero, then `steps` steps on the averaged gradients (every rank of
/// ctx's world calls it).
std::unique_ptr<ZeroRedundancyOptimizer> make_zero(const Scenario& s, RankContext& ctx,
                                                   const std::vector<Tensor>& params, int steps) {
  auto zero = make_zero(s, ctx, params);
  for (int t = 0; t < steps; ++t) {
    set_averaged_grads(s, ctx, params, t);
    zero->step();
  }
  return zero;
}

// Per rank: params after each step, [r][t][i].
using Trace = std::vector<std::vector<std::vector<Tensor>>>;

Trace run_zero(const Scenario& s, int world, int steps, std::vector<std::vector<int>>* owners = nullptr) {
  Trace out(static_cast<std::size_t>(world));
  if (owners) owners->assign(static_cast<std::size_t>(world), {});
  simulate(world, [&](RankContext& ctx) {
    auto params = initial_params(s);
    auto zero = make_zero(s, ctx, params);
    auto& mine = out[static_cast<std::size_t>(ctx.rank())];
    for (int t = 0; t < steps; ++t) {
      set_averaged_grads(s, ctx, params, t);
      zero->step();
      std::vector<Tensor> snap;
      for (const auto& p : params) snap.push_back(p.clone());
      mine.push_back(std::move(snap));
    }
    if (owners) (*owners)[static_cast<std::size_t>(ctx.rank())] = zero->param_owners();
  }, short_timeout());
  return out;
}

void require_trace_matches(const Trace& got, const std::vector<std::vector<Tensor>>& ref, int t_begin = 0) {
  for (std::size_t r = 0; r < got.size(); ++r)
    for (std::size_t t = 0; t < got[r].size(); ++t)
      for (std::size_t i = 0; i < got[r][t].size(); ++i) {
        INFO("rank " << r << " step " << (t + static_cast<std::size_t>(t_begin)) << " param " << i);
        REQUIRE(got[r][t][i].equal(ref[t + static_cast<std::size_t>(t_begin)][i]));
      }
}

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("dopt-zero-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  return d.string();
}

}  // namespace

TEST_CASE("ZeRO partition: sorted greedy, ties to the lowest rank (spec worked example)", "[zero]") {
  std::vector<std::vector<std::vector<std::int64_t>>> parts(3);
  std::vector<std::vector<int>> owners(3);
  simulate(3, [&](RankContext& ctx) {
    std::vector<Tensor> ps;
    for (auto n : {5, 9, 9, 3, 7, 1, 7}) ps.push_back(Tensor::zeros({n}));
    ZeroRedundancyOptimizer z(ps, OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});
    for (const auto& r : z.partition()) {
      std::vector<std::int64_t> ids;
      for (const auto& p : r[0]) ids.push_back(z.global_index(p));
      parts[static_cast<std::size_t>(ctx.rank())].push_back(ids);
    }
    owners[static_cast<std::size_t>(ctx.rank())] = z.param_owners();
  }, short_timeout());
  for (int r = 0; r < 3; ++r) {
    CHECK(parts[r][0] == std::vector<std::int64_t>{1, 0});
    CHECK(parts[r][1] == std::vector<std::int64_t>{2, 3, 5});
    CHECK(parts[r][2] == std::vector<std::int64_t>{4, 6});
    CHECK(owners[r] == std::vector<int>{0, 0, 1, 1, 2, 1, 2});
  }
}

TEST_CASE("ZeRO partition: sizes [9,7,5,3] x world give 24 elements per rank", "[zero]") {
  for (int world : {1, 2, 3, 5}) {
    std::vector<std::int64_t> local(world, 0);
    simulate(world, [&](RankContext& ctx) {
      std::vector<Tensor> ps;
      for (int k = 0; k < world; ++k)
        for (auto n : {9, 7, 5, 3}) ps.push_back(Tensor::zeros({n}));
      ZeroRedundancyOptimizer z(ps, OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});
      for (const auto& p : z.optim().all_params()) local[ctx.rank()] += p.numel();
    }, short_timeout());
    for (int r = 0; r < world; ++r) CHECK(local[r] == 24);
  }
}

TEST_CASE("ZeRO add_param_group re-partitions, ranks that get nothing get an empty group", "[zero]") {
  std::vector<std::vector<std::size_t>> local_sizes(3);
  std::vector<std::vector<int>> owners(3);
  std::vector<double> lr(3);
  simulate(3, [&](RankContext& ctx) {
    std::vector<Tensor> ps{Tensor::zeros({9}), Tensor::zeros({7}), Tensor::zeros({5})};
    ZeroRedundancyOptimizer z(ps, OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});
    z.add_param_group(OptimizerParamGroup({Tensor::zeros({3}), Tensor::zeros({4})}, SGDOptions(0.5)));
    for (const auto& g : z.optim().param_groups()) local_sizes[ctx.rank()].push_back(g.params.size());
    owners[ctx.rank()] = z.param_owners();
    lr[ctx.rank()] = z.optim().param_groups().back().options->get_lr();
  }, short_timeout());
  CHECK(local_sizes[0] == std::vector<std::size_t>{1, 0});
  CHECK(local_sizes[1] == std::vector<std::size_t>{1, 1});
  CHECK(local_sizes[2] == std::vector<std::size_t>{1, 1});
  for (int r = 0; r < 3; ++r) {
    CHECK(owners[r] == std::vector<int>{0, 1, 2, 1, 2});
    CHECK(lr[r] == 0.5);
  }
}

TEST_CASE("ZeRO equals a plain optimizer on the averaged gradients, bitwise", "[zero]") {
  for (const std::string opt : {"Adam", "SGD", "NAdam", "RAdam"}) {
    for (bool bucket : {false, true}) {
      for (bool later : {false, true}) {
        for (int world : {1, 2, 3, 5}) {
          INFO(opt << " bucket_view " << bucket << " add_param_group " << later << " world " << world);
          Scenario s = base_scenario(opt);
          s.bucket_view = bucket;
          s.add_last_group_later = later;
          const int steps = 4;
          const Reference ref = reference(s, world, steps);
          const Trace got = run_zero(s, world, steps);
          require_trace_matches(got, ref.params);
          // The frozen param and the param without a grad at step 1 behave as torch's.
          CHECK(got[0][steps - 1][3].equal(init_value(3, s.shapes[3], DType::float32)));
          CHECK(got[0][1][6].equal(got[0][0][6]));
        }
      }
    }
  }
}

TEST_CASE("ZeRO with more ranks than parameters", "[zero]") {
  Scenario s;
  s.shapes = {{4}, {2}, {3}};
  s.groups = {{0, 1, 2}};
  s.spec = OptimizerSpec{"Adam", {{"lr", 0.01}}};
  for (bool bucket : {false, true}) {
    s.bucket_view = bucket;
    std::vector<std::vector<int>> owners;
    const Reference ref = reference(s, 5, 3);
    const Trace got = run_zero(s, 5, 3, &owners);
    require_trace_matches(got, ref.params);
    CHECK(owners[4] == std::vector<int>{0, 2, 1});
  }
}

TEST_CASE("ZeRO bucket view: one flat buffer per (kind, rank), frozen params outside, dummies", "[zero]") {
  std::vector<std::string> problems;
  std::mutex m;
  simulate(3, [&](RankContext& ctx) {
    std::vector<Tensor> ps{Tensor::zeros({4}), Tensor::zeros({2}), Tensor::zeros({3})};
    ps[1].set_requires_grad(false);
    ZeroOptions o{ctx.world(), true};
    ZeroRedundancyOptimizer z(ps, OptimizerSpec{"SGD", {{"lr", 0.1}}}, o);
    std::vector<std::string> bad;
    if (z.bucket_count() != 1) bad.push_back("bucket count");
    std::vector<std::int64_t> numels;
    for (const auto& b : z.buckets()[0]) numels.push_back(b.numel());
    if (numels != std::vector<std::int64_t>{4, 3, 1}) bad.push_back("bucket numels");
    if (!ps[0].shares_storage_with(z.buckets()[0][0])) bad.push_back("param 0 not a view of rank 0's bucket");
    if (!ps[2].shares_storage_with(z.buckets()[0][1])) bad.push_back("param 2 not a view of rank 1's bucket");
    for (const auto& b : z.buckets()[0])
      if (ps[1].shares_storage_with(b)) bad.push_back("frozen param inside a bucket");
    std::lock_guard<std::mutex> lock(m);
    problems.insert(problems.end(), bad.begin(), bad.end());
  }, short_timeout());
  for (const auto& p : problems) FAIL_CHECK(p);
}

TEST_CASE("ZeRO bucket view: mixed dtypes (one bucket per dtype) and trainability changes", "[zero]") {
  Scenario s = base_scenario("Adam");
  s.dtypes = {DType::float32, DType::float64, DType::float32, DType::float32, DType::float64,
              DType::float64, DType::float32, DType::float32, DType::float64};
  s.bucket_view = true;
  s.unfreeze_at = 2;
  for (int world : {2, 3}) {
    INFO("world " << world);
    const Reference ref = reference(s, world, 4);
    const Trace got = run_zero(s, world, 4);
    require_trace_matches(got, ref.params);
  }
  s.bucket_view = false;
  require_trace_matches(run_zero(s, 3, 4), reference(s, 3, 4).params);
}

TEST_CASE("ZeRO step(closure) returns the closure's loss", "[zero]") {
  std::vector<double> loss(2);
  std::vector<int> calls(2);
  simulate(2, [&](RankContext& ctx) {
    Tensor p = Tensor::full({3}, 1.0);
    ZeroRedundancyOptimizer z({p}, OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});
    p.set_grad(Tensor::full({3}, 1.0));
    auto l = z.step([&] {
      ++calls[ctx.rank()];
      return 1.5 + ctx.rank();
    });
    loss[ctx.rank()] = l.value_or(-1);
  }, short_timeout());
  CHECK(loss[0] == 1.5);
  CHECK(loss[1] == 2.5);
  CHECK(calls == std::vector<int>{1, 1});
}

TEST_CASE("ZeRO consolidate_state_dict on any rank gives the unsharded layout", "[zero]") {
  for (int world : {2, 3, 5}) {
    Scenario s = base_scenario("Adam");
    const Reference ref = reference(s, world, 3);
    std::vector<StateDict> sds(world);
    std::vector<std::string> errors;
    std::mutex m;
    simulate(world, [&](RankContext& ctx) {
      auto params = initial_params(s);
      auto zero = make_zero(s, ctx, params, 3);
      for (int to = 0; to < world; ++to) {
        zero->consolidate_state_dict(to);
        if (ctx.rank() == to) {
          sds[to] = zero->state_dict();
          continue;
        }
        try {
          zero->state_dict();
          std::lock_guard<std::mutex> lock(m);
          errors.push_back("rank " + std::to_string(ctx.rank()) + ": state_dict did not throw");
        } catch (const StateError& e) {
          const std::string want = "consolidate_state_dict(to=" + std::to_string(ctx.rank()) + ")";
          if (std::string(e.what()).find(want) == std::string::npos) {
            std::lock_guard<std::mutex> lock(m);
            errors.push_back(e.what());
          }
        }
      }
    }, short_timeout());
    for (const auto& e : errors) FAIL_CHECK(e);
    for (int to = 0; to < world; ++to) {
      INFO("world " << world << " to " << to);
      const StateDict& got = sds[to];
      REQUIRE(got.param_groups.size() == ref.final_state.param_groups.size());
      for (std::size_t g = 0; g < got.param_groups.size(); ++g) {
        CHECK(got.param_groups[g].params == ref.final_state.param_groups[g].params);
        CHECK(got.param_groups[g].hyperparams == ref.final_state.param_groups[g].hyperparams);
      }
      REQUIRE(got.state.size() == ref.final_state.state.size());
      for (const auto& [id, st] : ref.final_state.state) {
        INFO("param " << id);
        REQUIRE(got.state.count(id) == 1);
        dopt::testing::require_same_state(st, got.state.at(id));
      }
    }
  }
}

TEST_CASE("ZeRO state-dict round trip: a fresh optimizer resumes bitwise like an uninterrupted run", "[zero]") {
  for (bool bucket : {false, true}) {
    for (int world : {2, 3}) {
      INFO("world " << world << " bucket_view " << bucket);
      Scenario s = base_scenario("Adam");
      s.bucket_view = bucket;
      const Reference ref = reference(s, world, 6);
      Trace got(static_cast<std::size_t>(world));
      StateDict shared;
      std::vector<double> lr(world);
      simulate(world, [&](RankContext& ctx) {
        auto params = initial_params(s);
        auto zero = make_zero(s, ctx, params, 3);
        zero->consolidate_state_dict(0);
        if (ctx.rank() == 0) shared = zero->state_dict();
        ctx.world().barrier();
        // A fresh optimizer over copies, with other hyperparameters: they come from the dict.
        std::vector<Tensor> fresh;
        for (const auto& p : params) {
          fresh.push_back(p.clone());
          fresh.back().set_requires_grad(p.requires_grad());
        }
        Scenario other = s;
        other.spec.hyperparameters["lr"] = 0.5;
        other.overrides.clear();
        auto z2 = make_zero(other, ctx, fresh);
        z2->load_state_dict(shared);
        lr[ctx.rank()] = z2->param_groups()[0].options->get_lr();
        for (int t = 3; t < 6; ++t) {
          set_averaged_grads(s, ctx, fresh, t);
          z2->step();
          std::vector<Tensor> snap;
          for (const auto& p : fresh) snap.push_back(p.clone());
          got[static_cast<std::size_t>(ctx.rank())].push_back(std::move(snap));
        }
      }, short_timeout());
      require_trace_matches(got, ref.params, 3);
      for (double l : lr) CHECK(l == 0.05);
    }
  }
}

TEST_CASE("ZeRO sharded checkpoints reshard N -> M and back", "[zero]") {
  Scenario s = base_scenario("Adam");
  const int total = 7;
  const Reference ref = reference(s, 1, total);  // gradients below are the same at every world size
  // Every world size must see the same averaged gradients: use world 1's
  // (grad of rank 0), which every rank sets directly.
  auto set_grads = [&](const std::vector<Tensor>& params, int t) {
    for (std::size_t i = 0; i < s.n(); ++i)
      params[i].set_grad(s.grad_at(t, i) ? averaged_grad(s, t, i, 1) : Tensor());
  };
  struct Stage {
    int world;
    int t_begin, t_end;
    std::string load, save;
  };
  const std::string d3 = temp_dir("n3"), d5 = temp_dir("m5"), d2 = temp_dir("m2"), d3b = temp_dir("n3b");
  // N=3 -> M=5 (larger) -> N=3 (back) -> M=2 (smaller) -> world 1.
  const std::vector<Stage> stages{{3, 0, 2, "", d3}, {5, 2, 3, d3, d5}, {3, 3, 4, d5, d3b},
                                  {2, 4, 5, d3b, d2}, {1, 5, 7, d2, ""}};
  std::vector<Tensor> current = initial_params(s);
  std::vector<int> owners_before;
  int prev_world = 0;
  for (const auto& st : stages) {
    INFO("stage: world " << st.world << " steps " << st.t_begin << ".." << st.t_end);
    Trace got(static_cast<std::size_t>(st.world));
    std::vector<ShardLoadReport> reports(st.world);
    std::vector<std::int64_t> step_counts(st.world);
    std::vector<int> owners_now;
    simulate(st.world, [&](RankContext& ctx) {
      std::vector<Tensor> params;
      for (std::size_t i = 0; i < current.size(); ++i) {
        params.push_back(current[i].clone());
        params.back().set_requires_grad(!s.frozen.count(i));
      }
      auto zero = make_zero(s, ctx, params);
      if (!st.load.empty()) {
        reports[static_cast<std::size_t>(ctx.rank())] = zero->load_sharded(st.load);
        step_counts[static_cast<std::size_t>(ctx.rank())] = zero->step_count();
      }
      if (ctx.rank() == 0) owners_now = zero->param_owners();
      for (int t = st.t_begin; t < st.t_end; ++t) {
        set_grads(params, t);
        zero->step();
        std::vector<Tensor> snap;
        for (const auto& p : params) snap.push_back(p.clone());
        got[static_cast<std::size_t>(ctx.rank())].push_back(std::move(snap));
      }
      if (!st.save.empty()) zero->save_sharded(st.save);
    }, short_timeout());
    require_trace_matches(got, ref.params, st.t_begin);
    if (!st.load.empty()) {
      std::int64_t tensors = 0;
      for (int r = 0; r < st.world; ++r) {
        CHECK(step_counts[r] == st.t_begin);
        const auto& rep = reports[r];
        // Exactly the shards that held this rank's parameters, each once, ascending.
        std::set<int> want;
        for (std::size_t i = 0; i < owners_now.size(); ++i)
          if (owners_now[i] == r) want.insert(owners_before[i]);
        CHECK(rep.shards_read == std::vector<int>(want.begin(), want.end()));
        CHECK(rep.saved_world_size == prev_world);
        tensors += rep.tensors_read;
      }
      CHECK(tensors == 8 * 3);  // Adam: step, exp_avg, exp_avg_sq of every param but the frozen one
    }
    current = got[0].back();
    owners_before = owners_now;
    prev_world = st.world;
  }
  for (const auto& d : {d3, d5, d2, d3b}) fs::remove_all(d);
}

namespace {

// A minimal DDP stand-in: averages the gradients over all ranks each
// iteration (joined ranks contribute zeros) and notifies the Join context.
// Its join hook shadows the all-reduces and leaves the averaged gradients in
// place, so ZeRO's hook then steps on the same gradients as everyone else.
class GradAverager : public Joinable {
 public:
  GradAverager(ProcessGroup g, std::vector<Tensor> params) : group_(std::move(g)), params_(std::move(params)) {}
  // `grads[i]`: this rank's gradient of param i (all defined).
  void average(const std::vector<Tensor>& grads) {
    Join::notify_join_context(*this).get();
    for (std::size_t i = 0; i < params_.size(); ++i) reduce(i, grads[i].clone());
  }
  std::unique_ptr<JoinHook> join_hook() override { return std::make_unique<Hook>(*this); }
  Device join_device() const override { return Device::cpu(); }
  ProcessGroup join_process_group() const override { return group_; }

 private:
  void reduce(std::size_t i, Tensor g) {
    group_.all_reduce(g, ReduceOp::sum);
    divide_(g, group_.size());
    params_[i].set_grad(g);
  }
  struct Hook : JoinHook {
    explicit Hook(GradAverager& a) : avg(a) {}
    void main_hook() override {
      for (std::size_t i = 0; i < avg.params_.size(); ++i)
        avg.reduce(i, Tensor::zeros(avg.params_[i].shape(), avg.params_[i].dtype()));
    }
    GradAverager& avg;
  };
  ProcessGroup group_;
  std::vector<Tensor> params_;
};

}  // namespace

TEST_CASE("ZeRO under Join with uneven inputs (gradient averager first, as torch's test)", "[zero][join]") {
  for (bool bucket : {false, true}) {
    for (int world : {2, 3, 5}) {
      INFO("world " << world << " bucket_view " << bucket);
      Scenario s = base_scenario("Adam");
      s.frozen.clear();
      s.has_grad = nullptr;
      s.bucket_view = bucket;
      // Rank r has 2 + r batches; the reference steps max(2 + r) times, with the
      // gradients of the ranks that still have batches (zeros for the others).
      const int iters = 2 + world - 1;
      auto params_ref = initial_params(s);
      auto opt = make_optimizer(s.spec, make_groups(s, params_ref, 0, s.groups.size()));
      std::vector<std::vector<Tensor>> ref;
      for (int t = 0; t < iters; ++t) {
        const int active_hi = world;  // ranks r with 2 + r > t are active
        for (std::size_t i = 0; i < s.n(); ++i) {
          Tensor acc;
          for (int r = 0; r < active_hi; ++r) {
            Tensor g = (2 + r > t) ? grad_value(t, r, i, s.shapes[i], s.dt(i)) : Tensor::zeros(s.shapes[i], s.dt(i));
            if (!acc.defined()) acc = g;
            else add_(acc, g);
          }
          divide_(acc, world);
          params_ref[i].set_grad(acc);
        }
        opt->step();
        std::vector<Tensor> snap;
        for (const auto& p : params_ref) snap.push_back(p.clone());
        ref.push_back(std::move(snap));
      }
      std::vector<std::vector<Tensor>> final_params(world);
      std::vector<std::int64_t> join_iters(world);
      REQUIRE_NOTHROW(simulate(world, [&](RankContext& ctx) {
        const int r = ctx.rank();
        auto params = initial_params(s);
        auto zero = make_zero(s, ctx, params);
        GradAverager avg(ctx.world(), params);
        Join join({&avg, zero.get()});
        for (int t = 0; t < 2 + r; ++t) {
          std::vector<Tensor> grads;
          for (std::size_t i = 0; i < s.n(); ++i) grads.push_back(grad_value(t, r, i, s.shapes[i], s.dt(i)));
          avg.average(grads);
          zero->step();
        }
        join.finish();
        join_iters[r] = join.iterations();
        for (const auto& p : params) final_params[r].push_back(p.clone());
      }, short_timeout()));
      for (int r = 0; r < world; ++r) {
        CHECK(join_iters[r] == world - 1 - r);
        for (std::size_t i = 0; i < s.n(); ++i) {
          INFO("rank " << r << " param " << i);
          REQUIRE(final_params[r][i].equal(ref.back()[i]));
        }
      }
    }
  }
}

TEST_CASE("ZeRO as the first joinable does not hang (torch 1.13 does)", "[zero][join]") {
  for (int world : {2, 3, 5}) {
    INFO("world " << world);
    Scenario s = base_scenario("SGD");
    s.frozen.clear();
    s.has_grad = nullptr;
    std::vector<std::vector<Tensor>> final_params(world);
    std::vector<int> owners;
    std::vector<std::int64_t> join_iters(world);
    REQUIRE_NOTHROW(simulate(world, [&](RankContext& ctx) {
      const int r = ctx.rank();
      auto params = initial_params(s);
      auto zero = make_zero(s, ctx, params);
      if (r == 0) owners = zero->param_owners();
      {
        Join join({zero.get()});
        for (int t = 0; t < 2 + r; ++t) {
          for (std::size_t i = 0; i < s.n(); ++i) params[i].set_grad(grad_value(t, r, i, s.shapes[i], s.dt(i)));
          zero->step();
        }
        zero->zero_grad(true);  // a joined rank steps on no gradients
        join.finish();
        join_iters[r] = join.iterations();
      }
      // After the Join, steps are plain again (no notify all-reduce).
      zero->step();
      for (const auto& p : params) final_params[r].push_back(p.clone());
    }, short_timeout()));
    // Param i follows its owner's own gradients for the owner's 2 + owner batches.
    for (std::size_t i = 0; i < s.n(); ++i) {
      const int o = owners[i];
      auto ps = initial_params(s);
      auto opt = make_optimizer(s.spec, make_groups(s, ps, 0, s.groups.size()));
      for (int t = 0; t < 2 + o; ++t) {
        for (std::size_t k = 0; k < s.n(); ++k) ps[k].set_grad(grad_value(t, o, k, s.shapes[k], s.dt(k)));
        opt->step();
      }
      for (int r = 0; r < world; ++r) {
        INFO("param " << i << " owner " << o << " rank " << r);
        REQUIRE(final_params[r][i].equal(ps[i]));
      }
    }
    for (int r = 0; r < world; ++r) CHECK(join_iters[r] == world - 1 - r);
  }
}

TEST_CASE("ZeRO errors", "[zero]") {
  const OptimizerSpec sgd{"SGD", {{"lr", 0.1}}};
  SECTION("construction arguments") {
    simulate(1, [&](RankContext& ctx) {
      ZeroOptions o{ctx.world()};
      CHECK_THROWS_AS(ZeroRedundancyOptimizer(std::vector<Tensor>{}, sgd, o), ValueError);
      CHECK_THROWS_AS(ZeroRedundancyOptimizer(std::vector<Tensor>{Tensor::zeros({2})}, sgd, ZeroOptions{}), ValueError);
      ZeroOptions ov{ctx.world(), false, true};
      // overlap_with_ddp is supported (zero_overlap.test.cpp); without a plan it has no partition yet.
      CHECK(ZeroRedundancyOptimizer(std::vector<Tensor>{Tensor::zeros({2})}, sgd, ov).overlap_with_ddp());
      Tensor p = Tensor::zeros({2});
      std::vector<OptimizerParamGroup> twice;
      twice.emplace_back(std::vector<Tensor>{p});
      twice.emplace_back(std::vector<Tensor>{p});
      CHECK_THROWS_AS(ZeroRedundancyOptimizer(std::move(twice), sgd, o), ValueError);
      // Twice in one group: refused too (torch would step it twice), naming both places.
      CHECK_THROWS_WITH(ZeroRedundancyOptimizer(std::vector<Tensor>{p, Tensor::zeros({3}), p}, sgd, o),
                        Catch::Contains("[rank 0]: parameter 2 of the group is the same tensor as parameter 0"));
      CHECK_THROWS_AS(ZeroRedundancyOptimizer(std::vector<Tensor>{Tensor::zeros({2}, DType::int64)}, sgd, o),
                      TypeError);
      std::vector<OptimizerParamGroup> wrong;
      wrong.emplace_back(std::vector<Tensor>{p}, AdamOptions(0.1));
      CHECK_THROWS_AS(ZeroRedundancyOptimizer(std::move(wrong), sgd, o), TypeError);
      CHECK_THROWS_AS(ZeroRedundancyOptimizer(std::vector<Tensor>{p}, OptimizerSpec{"NoSuch", {}}, o), ValueError);
    });
  }
  SECTION("state_dict without consolidate, load_state_dict mismatches") {
    std::vector<std::string> got(2);
    simulate(2, [&](RankContext& ctx) {
      std::vector<Tensor> ps{Tensor::zeros({3}), Tensor::zeros({2})};
      ZeroRedundancyOptimizer z(ps, sgd, ZeroOptions{ctx.world()});
      std::string& g = got[ctx.rank()];
      try {
        z.state_dict();
      } catch (const StateError& e) {
        if (std::string(e.what()).find("has not been consolidated on this rank") != std::string::npos &&
            std::string(e.what()).find("consolidate_state_dict(to=" + std::to_string(ctx.rank()) + ")") !=
                std::string::npos)
          g += "a";
      }
      StateDict two_groups;
      two_groups.param_groups.resize(2);
      try {
        z.load_state_dict(two_groups);
      } catch (const StateDictError&) {
        g += "b";
      }
      StateDict bad_index;
      bad_index.param_groups.resize(1);
      bad_index.param_groups[0].params = {0, 1};
      bad_index.param_groups[0].hyperparams = z.param_groups()[0].options->to_hyperparams();
      bad_index.state[7]["momentum_buffer"] = Tensor::zeros({3});
      try {
        z.load_state_dict(bad_index);
      } catch (const StateDictError&) {
        g += "c";
      }
      try {
        z.consolidate_state_dict(2);
      } catch (const ValueError&) {
        g += "d";
      }
    }, short_timeout());
    CHECK(got[0] == "abcd");
    CHECK(got[1] == "abcd");
  }
  SECTION("mismatched parameter lists across ranks") {
    for (int variant = 0; variant < 3; ++variant) {
      INFO("variant " << variant);
      std::vector<std::string> got(3);
      simulate(3, [&](RankContext& ctx) {
        std::vector<OptimizerParamGroup> groups;
        const bool odd = ctx.rank() == 1;
        if (variant == 0) {  // an extra parameter
          std::vector<Tensor> ps{Tensor::zeros({3}), Tensor::zeros({2})};
          if (odd) ps.push_back(Tensor::zeros({1}));
          groups.emplace_back(ps);
        } else if (variant == 1) {  // another shape
          groups.emplace_back(std::vector<Tensor>{Tensor::zeros({3}), Tensor::zeros({odd ? 4 : 2})});
        } else {  // the same parameters, grouped differently
          std::vector<Tensor> ps{Tensor::zeros({3}), Tensor::zeros({2})};
          if (odd) {
            groups.emplace_back(std::vector<Tensor>{ps[0]});
            groups.emplace_back(std::vector<Tensor>{ps[1]});
          } else {
            groups.emplace_back(ps);
          }
        }
        try {
          ZeroRedundancyOptimizer z(std::move(groups), sgd, ZeroOptions{ctx.world()});
        } catch (const ValueError& e) {
          if (std::string(e.what()).find("differ across ranks") != std::string::npos) got[ctx.rank()] = "ok";
          else got[ctx.rank()] = e.what();
        }
      }, short_timeout());
      for (const auto& g : got) CHECK(g == "ok");
    }
  }
  SECTION("mismatched add_param_group leaves the optimizer usable") {
    std::vector<std::string> got(3);
    simulate(3, [&](RankContext& ctx) {
      Tensor p = Tensor::full({3}, 1.0);
      ZeroRedundancyOptimizer z({p}, sgd, ZeroOptions{ctx.world()});
      try {
        z.add_param_group(OptimizerParamGroup({Tensor::zeros({ctx.rank() == 2 ? 5 : 4})}));
      } catch (const ValueError& e) {
        if (std::string(e.what()).find("differ across ranks") != std::string::npos) got[ctx.rank()] += "a";
      }
      if (z.param_groups().size() == 1 && z.all_params().size() == 1 && z.optim().param_groups().size() == 1)
        got[ctx.rank()] += "b";
      p.set_grad(Tensor::full({3}, 1.0));
      z.step();
      if (p.at(0) == static_cast<double>(1.0f - 0.1f)) got[ctx.rank()] += "c";
    }, short_timeout());
    for (const auto& g : got) CHECK(g == "abc");
  }
  SECTION("sharded checkpoint errors") {
    const std::string empty = temp_dir("empty"), mixed = temp_dir("mixed"), a = temp_dir("a");
    fs::create_directories(empty);
    std::vector<std::string> got(2);
    simulate(2, [&](RankContext& ctx) {
      std::vector<Tensor> ps{Tensor::zeros({3}), Tensor::zeros({2})};
      ZeroRedundancyOptimizer z(ps, OptimizerSpec{"Adam", {}}, ZeroOptions{ctx.world()});
      for (auto& p : ps) p.set_grad(Tensor::full(p.shape(), 1.0));
      z.step();
      z.save_sharded(a);
      z.save_sharded(mixed);
      std::string& g = got[ctx.rank()];
      try {
        z.load_sharded(empty);
      } catch (const IOError&) {
        g += "a";
      }
      ctx.world().barrier();
      if (ctx.rank() == 0) fs::copy_file(fs::path(a) / "optim-rank0-of-2.safetensors",
                                         fs::path(mixed) / "optim-rank0-of-3.safetensors");
      ctx.world().barrier();
      try {
        z.load_sharded(mixed);
      } catch (const IOError& e) {
        if (std::string(e.what()).find("several world sizes") != std::string::npos) g += "b";
      }
      std::vector<Tensor> other{Tensor::zeros({3}), Tensor::zeros({5})};
      ZeroRedundancyOptimizer z2(other, OptimizerSpec{"Adam", {}}, ZeroOptions{ctx.world()});
      try {
        z2.load_sharded(a);
      } catch (const StateDictError&) {
        g += "c";
      }
      ZeroRedundancyOptimizer z3(std::vector<Tensor>{Tensor::zeros({3}), Tensor::zeros({2})}, sgd,
                                 ZeroOptions{ctx.world()});
      try {
        z3.load_sharded(a);
      } catch (const StateDictError&) {
        g += "d";
      }
      // The shard is a valid dopt state file too.
      StateDict sd = dopt::load_state_dict((fs::path(a) / ZeroRedundancyOptimizer::shard_file_name(ctx.rank(), 2)).string());
      if (sd.metadata.at("dopt.zero.world_size") == "2" && sd.metadata.at("dopt.zero.step") == "1") g += "e";
    }, short_timeout());
    CHECK(got[0] == "abcde");
    CHECK(got[1] == "abcde");
    for (const auto& d : {empty, mixed, a}) fs::remove_all(d);
  }
}

TEST_CASE("ZeRO load_sharded refuses a flipped bit or a planted NaN / negative in any state tensor, naming the file "
          "and the tensor",
          "[zero][checksum]") {
  const std::string dir = temp_dir("corrupt");
  // World 3 writes 3 shards of Adam state (step, exp_avg, exp_avg_sq per parameter).
  simulate(3, [&](RankContext& ctx) {
    std::vector<Tensor> ps{Tensor::full({4}, 0.5), Tensor::full({3}, -0.25), Tensor::full({5}, 1.0)};
    ZeroRedundancyOptimizer z(ps, OptimizerSpec{"Adam", {}}, ZeroOptions{ctx.world()});
    for (auto& p : ps) p.set_grad(Tensor::full(p.shape(), 0.1));
    z.step();
    z.save_sharded(dir);
  }, short_timeout());
  struct Case {
    std::string file, tensor, kind;
  };
  std::vector<Case> cases;
  for (int r = 0; r < 3; ++r) {
    const std::string f = (fs::path(dir) / ZeroRedundancyOptimizer::shard_file_name(r, 3)).string();
    SafetensorsReader rd(f);
    REQUIRE(rd.verified());
    for (const auto& e : rd.entries()) {
      cases.push_back({f, e.name, "flip"});
      cases.push_back({f, e.name, "nan"});
      if (e.name.find("exp_avg_sq") != std::string::npos || e.name.find("step") != std::string::npos)
        cases.push_back({f, e.name, "negative"});
    }
  }
  REQUIRE(cases.size() >= 3 * 3 + 3 * 3 + 2 * 3);
  std::vector<std::string> errors(cases.size());
  bool clean_ok = false;
  simulate(1, [&](RankContext& ctx) {
    std::vector<Tensor> ps{Tensor::full({4}, 0.5), Tensor::full({3}, -0.25), Tensor::full({5}, 1.0)};
    ZeroRedundancyOptimizer z(ps, OptimizerSpec{"Adam", {}}, ZeroOptions{ctx.world()});
    z.load_sharded(dir);
    clean_ok = z.step_count() == 1;
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      std::ifstream in(c.file, std::ios::binary);
      const std::string good((std::istreambuf_iterator<char>(in)), {});
      in.close();
      if (c.kind == "flip") {
        SafetensorsReader rd(c.file);
        const auto& e = rd.entry(c.tensor);
        std::string bad = good;
        bad[rd.data_offset() + e.begin] ^= 0x10;
        std::ofstream(c.file, std::ios::binary | std::ios::trunc).write(bad.data(), static_cast<std::streamsize>(bad.size()));
      } else {  // rewritten with valid checksums: only the plausibility checks can catch it
        SafetensorsFile f = read_safetensors(c.file);
        Tensor t = f.tensors.at(c.tensor).clone();
        t.flatten().flat_slice(t.numel() - 1, 1).fill_(c.kind == "nan" ? std::nan("") : -1.0);
        f.tensors[c.tensor] = t;
        write_safetensors(c.file, f.tensors, f.metadata);
      }
      try {
        z.load_sharded(dir);
        errors[k] = "loaded";
      } catch (const Error& e) {
        errors[k] = std::string(dynamic_cast<const StateDictError*>(&e) ? "StateDictError: "
                                : dynamic_cast<const IOError*>(&e)      ? "IOError: "
                                                                         : "Error: ") +
                    e.what();
      }
      std::ofstream(c.file, std::ios::binary | std::ios::trunc).write(good.data(), static_cast<std::streamsize>(good.size()));
    }
  }, short_timeout());
  CHECK(clean_ok);
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    INFO(c.kind << " in " << c.file << " / " << c.tensor << ": " << errors[k]);
    if (c.kind == "flip") {
      CHECK_THAT(errors[k], Catch::StartsWith("IOError: "));
      CHECK_THAT(errors[k], Catch::Contains(c.file + ": tensor '" + c.tensor + "' does not match its checksum"));
    } else {
      CHECK_THAT(errors[k], Catch::StartsWith("StateDictError: "));
      CHECK_THAT(errors[k], Catch::Contains(c.file + ": tensor '" + c.tensor + "' holds " +
                                            (c.kind == "nan" ? "NaN" : "-1")));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("optimizer state checks: non-finite values and negative second moments are refused", "[zero][checksum]") {
  CHECK(find_impossible_state("exp_avg", Tensor::from_vector<float>({1.f, -2.f})).empty());
  CHECK(find_impossible_state("exp_avg_sq", Tensor::from_vector<float>({0.f, 2.f})).empty());
  CHECK(find_impossible_state("exp_avg_sq", Tensor::from_vector<float>({-0.f})).empty());
  CHECK(find_impossible_state("exp_avg", Tensor::from_vector<float>({1.f, NAN})) == "holds NaN at element 1 of 2");
  CHECK(find_impossible_state("momentum_buffer", Tensor::from_vector<double>({INFINITY})) ==
        "holds inf at element 0 of 1");
  CHECK(find_impossible_state("exp_avg_sq", Tensor::from_vector<float>({1.f, 2.f, -1.f})) ==
        "holds -1 at element 2 of 3, but 'exp_avg_sq' is never negative");
  CHECK(find_impossible_state("step", Tensor::scalar(-3.0, DType::int64)) ==
        "holds -3 at element 0 of 1, but 'step' is never negative");
  CHECK(find_impossible_state("sum", Tensor::from_vector<float>({1.f}).to(DType::bfloat16)).empty());
  CHECK(find_impossible_state("sum", Tensor::from_vector<float>({-1.f}).to(DType::float16)) ==
        "holds -1 at element 0 of 1, but 'sum' is never negative");
  // Adam.load_state_dict from a state dict in memory
  std::vector<Tensor> ps{Tensor::zeros({3})};
  auto adam = make_optimizer(OptimizerSpec{"Adam", {}}, std::vector<OptimizerParamGroup>{OptimizerParamGroup(ps)});
  ps[0].set_grad(Tensor::full({3}, 1.0));
  adam->step();
  StateDict sd = adam->state_dict();
  sd.state.at(0).at("exp_avg_sq").flatten().flat_slice(1, 1).fill_(std::nan(""));
  CHECK_THROWS_WITH(adam->load_state_dict(sd), Catch::Contains("state 'exp_avg_sq' of parameter id 0 holds NaN at "
                                                               "element 1 of 3"));
}

namespace {
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("ZeRO shard_state_dict is a snapshot of the shard save_sharded writes", "[zero]") {
  const std::string a = temp_dir("snap_a"), b = temp_dir("snap_b");
  std::vector<std::string> got(3);
  simulate(3, [&](RankContext& ctx) {
    std::vector<Tensor> ps{Tensor::full({5}, 0.5), Tensor::full({3, 2}, -1.0), Tensor::full({4}, 2.0)};
    ZeroRedundancyOptimizer z(ps, OptimizerSpec{"Adam", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});
    for (auto& p : ps) p.set_grad(Tensor::full(p.shape(), 0.25));
    z.step();
    const std::map<std::string, std::string> meta{{"dopt.checkpoint.step", "1"}};
    const std::string file = ZeroRedundancyOptimizer::shard_file_name(ctx.rank(), 3);
    const StateDict shard = z.shard_state_dict(meta);
    z.save_sharded(a, meta);
    z.step();  // the snapshot must not follow the live state
    fs::create_directories(b);
    save_state_dict(shard, (fs::path(b) / file).string());
    std::string& g = got[ctx.rank()];
    if (file_bytes((fs::path(a) / file).string()) == file_bytes((fs::path(b) / file).string())) g += "a";
    try {
      (void)z.shard_state_dict({{"dopt.zero.step", "7"}});
    } catch (const ValueError& e) {
      if (std::string(e.what()).find("ZeroRedundancyOptimizer.shard_state_dict") != std::string::npos) g += "b";
    }
    ctx.world().barrier();
    // load_sharded reads the snapshot's files as save_sharded's.
    std::vector<Tensor> qs{Tensor::full({5}, 0.5), Tensor::full({3, 2}, -1.0), Tensor::full({4}, 2.0)};
    ZeroRedundancyOptimizer z2(qs, OptimizerSpec{"Adam", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});
    if (z2.load_sharded(b).saved_world_size == 3 && z2.step_count() == 1) g += "c";
  }, short_timeout());
  for (const auto& g : got) CHECK(g == "abc");
  for (const auto& d : {a, b}) fs::remove_all(d);
}
