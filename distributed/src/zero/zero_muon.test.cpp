// Muon under ZeRO-1 (and under PostLocalSGDOptimizer) over simulated ranks:
// the same bits at world sizes 1, 2, 3 and 5 as one Muon on one rank, with
// gradient accumulation; exactly one orthogonalisation per matrix per step;
// the partition weighted by Newton-Schulz cost; state dicts and sharded
// checkpoints resharded N -> M. Rank functions only record; the test thread
// asserts after simulate() returned.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/distributed/zero.hpp"
#include "reference_data.hpp"
#include "sim_timeout.hpp"

using namespace dopt;
using namespace dopt::optim;
namespace fs = std::filesystem;

namespace {

const std::vector<Shape> kShapes{{24, 40}, {40, 24}, {32, 32}, {16, 64}, {8, 8}, {3, 5}, {64, 16}};
constexpr int kMicro = 30;  // micro-batches per step, over all ranks: divisible by 1, 2, 3 and 5

SimulateOptions short_timeout() { return dopt::testing::with_timeout(std::chrono::seconds(60)); }

std::vector<Tensor> initial(DType dt) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < kShapes.size(); ++i) {
    auto v = dopt::testing::values<double>(static_cast<std::size_t>(shape_numel(kShapes[i])), 3 + i, 0.5);
    ps.push_back(Tensor::from_vector(v, kShapes[i]).to(dt));
  }
  return ps;
}

// Micro-batch j's gradient of parameter i at step t: multiples of 2^-10 in
// [-8, 8], so that any sum of up to 30 of them is exact in float32: the
// accumulated, all-reduced gradient is then the same bits whatever the world
// size and however the micro-batches are split over the ranks.
Tensor micro_grad(int t, int j, std::size_t i, DType dt) {
  auto v = dopt::testing::values<double>(static_cast<std::size_t>(shape_numel(kShapes[i])),
                                7000 + 100 * static_cast<std::uint64_t>(t) + 3 * static_cast<std::uint64_t>(j) + 1000 * i);
  for (auto& x : v) x = std::round(x * 8192.0) / 1024.0;
  return Tensor::from_vector(v, kShapes[i]).to(dt);
}

void add_to(const Tensor& acc, const Tensor& g) {
  if (acc.dtype() == DType::float32) {
    float* d = acc.data<float>();
    const float* s = g.data<float>();
    for (std::int64_t k = 0; k < acc.numel(); ++k) d[k] += s[k];
  } else {
    double* d = acc.data<double>();
    const double* s = g.data<double>();
    for (std::int64_t k = 0; k < acc.numel(); ++k) d[k] += s[k];
  }
}

void divide(const Tensor& g, int n) {
  if (g.dtype() == DType::float32) {
    float* d = g.data<float>();
    for (std::int64_t k = 0; k < g.numel(); ++k) d[k] /= static_cast<float>(n);
  } else {
    double* d = g.data<double>();
    for (std::int64_t k = 0; k < g.numel(); ++k) d[k] /= static_cast<double>(n);
  }
}

// Parameter 5 has no gradient at step 1 (skipped: no orthogonalisation).
bool has_grad(int t, std::size_t i) { return !(i == 5 && t == 1); }

// The gradient every rank holds after accumulation and averaging.
Tensor global_grad(int t, std::size_t i, DType dt) {
  Tensor acc = Tensor::zeros(kShapes[i], dt);
  for (int j = 0; j < kMicro; ++j) add_to(acc, micro_grad(t, j, i, dt));
  divide(acc, kMicro);
  return acc;
}

std::vector<OptimizerParamGroup> groups_of(const std::vector<Tensor>& p) {
  // Two groups with their own hyperparameters.
  return {OptimizerParamGroup({p[0], p[1], p[2], p[3]}, MuonOptions(0.02).weight_decay(0.05)),
          OptimizerParamGroup({p[4], p[5], p[6]}, MuonOptions(0.01).nesterov(false).adjust_lr_fn("match_rms_adamw"))};
}

// One Muon on one rank: params after each step.
std::vector<std::vector<Tensor>> reference(DType dt, int t_end) {
  auto p = initial(dt);
  Muon opt(groups_of(p), MuonOptions());
  std::vector<std::vector<Tensor>> out;
  for (int t = 0; t < t_end; ++t) {
    for (std::size_t i = 0; i < p.size(); ++i) p[i].set_grad(has_grad(t, i) ? global_grad(t, i, dt) : Tensor());
    opt.step();
    std::vector<Tensor> snap;
    for (const auto& x : p) snap.push_back(x.clone());
    out.push_back(std::move(snap));
  }
  return out;
}

// On a rank: accumulates its share of the micro-batches into p.grad, then
// all-reduces (sum) and divides by the number of micro-batches.
void accumulate_and_average(RankContext& ctx, const std::vector<Tensor>& p, int t) {
  const int w = ctx.world_size(), r = ctx.rank();
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (!has_grad(t, i)) {
      p[i].set_grad(Tensor());
      continue;
    }
    Tensor acc = Tensor::zeros(kShapes[i], p[i].dtype());
    for (int j = r * (kMicro / w); j < (r + 1) * (kMicro / w); ++j) add_to(acc, micro_grad(t, j, i, p[i].dtype()));
    ctx.world().all_reduce(acc, ReduceOp::sum);
    divide(acc, kMicro);
    p[i].set_grad(acc);
  }
}

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("dopt-zero-muon-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  return d.string();
}

int matrices_with_grad(int t_begin, int t_end) {
  int n = 0;
  for (int t = t_begin; t < t_end; ++t)
    for (std::size_t i = 0; i < kShapes.size(); ++i) n += has_grad(t, i) ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("ZeRO-Muon: the same bits at world sizes 1, 2, 3, 5 as one Muon, one orthogonalisation per matrix per step",
          "[zero][muon]") {
  const int steps = 3;
  for (DType dt : {DType::float32, DType::float64}) {
    const auto ref = reference(dt, steps);
    for (auto weight : {ZeroPartitionWeight::element_count, ZeroPartitionWeight::step_cost}) {
      for (bool bucket : {false, true}) {
        for (int world : {1, 2, 3, 5}) {
          INFO(dtype_name(dt) << " world " << world << " step_cost " << (weight == ZeroPartitionWeight::step_cost)
                              << " bucket view " << bucket);
          std::vector<int> mismatches(static_cast<std::size_t>(world), 0);
          const std::int64_t before = muon_orthogonalizations();
          simulate(world, [&](RankContext& ctx) {
            auto p = initial(dt);
            ZeroOptions zo;
            zo.process_group = ctx.world();
            zo.partition_weight = weight;
            zo.parameters_as_bucket_view = bucket;
            ZeroRedundancyOptimizer zero(groups_of(p), MuonOptions(), zo);
            for (int t = 0; t < steps; ++t) {
              accumulate_and_average(ctx, p, t);
              zero.step();
              for (std::size_t i = 0; i < p.size(); ++i)
                mismatches[static_cast<std::size_t>(ctx.rank())] += p[i].equal(ref[t][i]) ? 0 : 1;
            }
          }, short_timeout());
          for (int r = 0; r < world; ++r) CHECK(mismatches[static_cast<std::size_t>(r)] == 0);
          // However many micro-batches each rank accumulated: each matrix once, on its owner.
          CHECK(muon_orthogonalizations() - before == matrices_with_grad(0, steps));
        }
      }
    }
  }
}

TEST_CASE("ZeRO partition weighted by Newton-Schulz cost balances the work that element counts do not",
          "[zero][muon]") {
  // Four matrices of 2^18 elements each; their Newton-Schulz costs differ by 12x.
  const std::vector<Shape> shapes{{64, 4096}, {512, 512}, {256, 1024}, {128, 2048}};
  std::vector<std::vector<int>> owners(2);
  std::vector<std::vector<double>> weights(2);
  for (int mode = 0; mode < 2; ++mode) {
    simulate(2, [&](RankContext& ctx) {
      std::vector<Tensor> p;
      for (const auto& s : shapes) p.push_back(Tensor::zeros(s, DType::float32));
      ZeroOptions zo;
      zo.process_group = ctx.world();
      zo.partition_weight = mode == 0 ? ZeroPartitionWeight::element_count : ZeroPartitionWeight::step_cost;
      ZeroRedundancyOptimizer zero(p, MuonOptions(), zo);
      if (ctx.rank() == 0) owners[static_cast<std::size_t>(mode)] = zero.param_owners(), weights[static_cast<std::size_t>(mode)] = zero.partition_weights();
    }, short_timeout());
  }
  // Element count (torch's): equal sizes keep their order, alternating ranks.
  CHECK(owners[0] == std::vector<int>{0, 1, 0, 1});
  // Cost: 512x512 (5 * 3 * 512^3) alone on rank 0, the other three on rank 1.
  CHECK(owners[1] == std::vector<int>{1, 0, 1, 1});
  const MuonOptions o;
  for (std::size_t i = 0; i < shapes.size(); ++i) CHECK(weights[1][i] == std::floor(o.step_cost(shapes[i])));
  CHECK(weights[0] == std::vector<double>(4, 262144.0));
  auto imbalance = [&](const std::vector<int>& own) {  // max over ranks / mean
    double load[2] = {0, 0};
    for (std::size_t i = 0; i < shapes.size(); ++i) load[own[i]] += o.step_cost(shapes[i]);
    return std::max(load[0], load[1]) / ((load[0] + load[1]) / 2);
  };
  CAPTURE(imbalance(owners[0]), imbalance(owners[1]));
  CHECK(imbalance(owners[0]) > 1.4);
  CHECK(imbalance(owners[1]) < 1.25);
}

TEST_CASE("ZeRO-Muon refuses a parameter that is not a matrix on every rank, before any collective", "[zero][muon]") {
  std::vector<std::string> errors(3);
  simulate(3, [&](RankContext& ctx) {
    std::vector<Tensor> p{Tensor::zeros({4, 4}, DType::float32), Tensor::zeros({4}, DType::float32)};
    ZeroOptions zo;
    zo.process_group = ctx.world();
    try {
      ZeroRedundancyOptimizer zero(p, MuonOptions(), zo);
    } catch (const ValueError& e) {
      errors[static_cast<std::size_t>(ctx.rank())] = e.what();
    }
  }, short_timeout());
  for (const auto& e : errors) CHECK_THAT(e, Catch::Matchers::Contains("Muon only supports 2D parameters"));
}

TEST_CASE("ZeRO-Muon sharded checkpoints resharded 3 -> 5 -> 2 -> 1, and consolidate_state_dict, continue bit for bit",
          "[zero][muon]") {
  const DType dt = DType::float64;
  const auto ref = reference(dt, 6);
  struct Stage {
    int world, t_begin, t_end;
    std::string load, save;
  };
  const std::string d3 = temp_dir("n3"), d5 = temp_dir("m5"), d2 = temp_dir("m2");
  const std::vector<Stage> stages{{3, 0, 2, "", d3}, {5, 2, 3, d3, d5}, {2, 3, 4, d5, d2}, {1, 4, 5, d2, ""}};
  std::vector<Tensor> current = initial(dt);
  for (const auto& st : stages) {
    INFO("world " << st.world << " steps " << st.t_begin << ".." << st.t_end);
    std::vector<int> mismatches(static_cast<std::size_t>(st.world), 0);
    std::vector<Tensor> last(current.size());
    StateDict consolidated;
    simulate(st.world, [&](RankContext& ctx) {
      std::vector<Tensor> p;
      for (const auto& c : current) p.push_back(c.clone());
      ZeroOptions zo;
      zo.process_group = ctx.world();
      zo.partition_weight = ZeroPartitionWeight::step_cost;
      ZeroRedundancyOptimizer zero(groups_of(p), MuonOptions(), zo);
      if (!st.load.empty()) zero.load_sharded(st.load);
      for (int t = st.t_begin; t < st.t_end; ++t) {
        accumulate_and_average(ctx, p, t);
        zero.step();
        for (std::size_t i = 0; i < p.size(); ++i)
          mismatches[static_cast<std::size_t>(ctx.rank())] += p[i].equal(ref[t][i]) ? 0 : 1;
      }
      if (!st.save.empty()) zero.save_sharded(st.save);
      zero.consolidate_state_dict(0);
      if (ctx.rank() == 0) {
        consolidated = zero.state_dict();
        for (std::size_t i = 0; i < p.size(); ++i) last[i] = p[i].clone();
      }
    }, short_timeout());
    for (int m : mismatches) CHECK(m == 0);
    current = last;
    // The consolidated dict resumes a plain Muon on one rank, bit for bit.
    if (st.t_end < 6) {
      std::vector<Tensor> p;
      for (const auto& c : current) p.push_back(c.clone());
      Muon plain(groups_of(p), MuonOptions(0.7));
      plain.load_state_dict(consolidated);
      const int t = st.t_end;
      for (std::size_t i = 0; i < p.size(); ++i) p[i].set_grad(has_grad(t, i) ? global_grad(t, i, dt) : Tensor());
      plain.step();
      for (std::size_t i = 0; i < p.size(); ++i) CHECK(p[i].equal(ref[t][i]));
    }
  }
  for (const auto& d : {d3, d5, d2}) fs::remove_all(d);
}

TEST_CASE("PostLocalSGDOptimizer over Muon equals Muon + PeriodicModelAverager at world 3", "[post_local_sgd][muon]") {
  std::vector<int> mismatches(3, 0);
  simulate(3, [&](RankContext& ctx) {
    auto a = initial(DType::float32), b = initial(DType::float32);
    Muon manual_opt(groups_of(a), MuonOptions());
    PeriodicModelAverager manual(2, 1, ctx.world());
    PostLocalSGDOptimizer opt(std::make_unique<Muon>(groups_of(b), MuonOptions()),
                              std::make_unique<PeriodicModelAverager>(2, 1, ctx.world()));
    for (int t = 0; t < 4; ++t) {
      for (std::size_t i = 0; i < a.size(); ++i) {
        // Each rank its own micro-batch: local steps differ until averaged.
        Tensor g = micro_grad(t, ctx.rank(), i, DType::float32);
        a[i].set_grad(g.clone());
        b[i].set_grad(g.clone());
      }
      manual_opt.step();
      manual.average_parameters(manual_opt.param_groups());
      opt.step();
      for (std::size_t i = 0; i < a.size(); ++i) mismatches[static_cast<std::size_t>(ctx.rank())] += a[i].equal(b[i]) ? 0 : 1;
    }
  }, short_timeout());
  for (int m : mismatches) CHECK(m == 0);
}
