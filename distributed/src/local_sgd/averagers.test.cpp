// Model averagers over simulated ranks: schedules, arithmetic (checked against
// an independent computation: sum over ranks of p_r / n in rank order), real
// subgroups for the hierarchical averager, and the constructor errors.
// Rank functions record; Catch assertions run after simulate() returned.
#include <catch2/catch.hpp>

#include <map>
#include <mutex>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/averagers.hpp"
#include "ring_order_reference.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

// p_r = base + r (+ e for element e); the average torch computes: each
// rank's value divided by n, summed in gloo's ring order (for n >= 3),
// computed here independently (ring_order_reference.hpp).
float avg_of(float base, int e, int numel, const std::vector<int>& ranks) {
  const int n = static_cast<int>(ranks.size());
  float acc = 0.0f;
  for (int k = 0; k < n; ++k) {
    const int g = ring_reference::contributor(e, numel, n, k);
    const float v = (base + static_cast<float>(ranks[static_cast<std::size_t>(g)]) + static_cast<float>(e)) /
                    static_cast<float>(n);
    acc = k == 0 ? v : acc + v;
  }
  return acc;
}

Tensor rank_tensor(int r, float base, int numel) {
  std::vector<float> v(static_cast<std::size_t>(numel));
  for (int e = 0; e < numel; ++e) v[static_cast<std::size_t>(e)] = base + static_cast<float>(r) + static_cast<float>(e);
  Tensor t = Tensor::from_vector(v);
  t.set_grad(Tensor::zeros({numel}));
  return t;
}

std::vector<int> iota_ranks(int n) {
  std::vector<int> r;
  for (int i = 0; i < n; ++i) r.push_back(i);
  return r;
}

}  // namespace

TEST_CASE("PeriodicModelAverager averages at warmup, warmup + period, ... (world 2, 3, 5)", "[averagers]") {
  for (int world : {2, 3, 5}) {
    for (auto [period, warmup] : {std::pair<int, int>{4, 12}, {4, 13}, {3, 2}, {2, 0}}) {
      std::mutex m;
      std::map<int, std::vector<std::vector<float>>> seen;  // rank -> per step values
      std::vector<std::int64_t> final_steps;
      simulate(world, [&](RankContext& ctx) {
        PeriodicModelAverager avg(period, warmup, ctx.world());
        std::vector<std::vector<float>> mine;
        for (int step = 0; step < 20; ++step) {
          Tensor p = rank_tensor(ctx.rank(), 1.5f, 5);  // reset to rank each step
          avg.average_parameters(std::vector<Tensor>{p});
          mine.push_back(p.to_vector<float>());
        }
        std::lock_guard<std::mutex> lock(m);
        seen[ctx.rank()] = mine;
        final_steps.push_back(avg.step());
      });
      for (auto s : final_steps) CHECK(s == 20);
      for (int r = 0; r < world; ++r)
        for (int step = 0; step < 20; ++step) {
          const bool averaged = step >= warmup && (step - warmup) % period == 0;
          for (int e = 0; e < 5; ++e) {
            const float expect = averaged ? avg_of(1.5f, e, 5, iota_ranks(world))
                                          : 1.5f + static_cast<float>(r) + static_cast<float>(e);
            INFO("world " << world << " period " << period << " warmup " << warmup << " rank " << r << " step "
                          << step << " element " << e);
            CHECK(seen[r][static_cast<std::size_t>(step)][static_cast<std::size_t>(e)] == expect);
          }
        }
    }
  }
}

TEST_CASE("average_parameters: only params with a grad, groups, mixed dtypes (one all_reduce each)", "[averagers]") {
  const int world = 3;
  std::mutex m;
  std::map<int, std::vector<double>> out;
  simulate(world, [&](RankContext& ctx) {
    const int r = ctx.rank();
    Tensor a = rank_tensor(r, 0.25f, 3);
    Tensor b = rank_tensor(r, 7.0f, 2);
    b.set_grad(Tensor());  // no gradient: not averaged
    Tensor c = Tensor::from_vector(std::vector<double>{0.1 + r, 0.2 + r});
    c.set_grad(Tensor::zeros({2}, DType::float64));
    std::vector<OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<Tensor>{a, b});
    groups.emplace_back(std::vector<Tensor>{c});
    PeriodicModelAverager avg(2, 0, ctx.world());
    avg.average_parameters(groups);
    std::vector<double> rec;
    for (auto& t : {a, b, c})
      for (std::int64_t i = 0; i < t.numel(); ++i) rec.push_back(t.at(i));
    std::lock_guard<std::mutex> lock(m);
    out[r] = rec;
  });
  for (int r = 0; r < world; ++r) {
    const auto& v = out[r];
    for (int e = 0; e < 3; ++e) CHECK(static_cast<float>(v[static_cast<std::size_t>(e)]) == avg_of(0.25f, e, 3, {0, 1, 2}));
    CHECK(v[3] == 7.0 + r);
    CHECK(v[4] == 8.0 + r);
    // float64, 2 elements, 3 ranks: both in chunk 0, summed from rank 1 round to rank 0.
    double e0 = ((0.1 + 1) / 3 + (0.1 + 2) / 3) + 0.1 / 3;
    double e1 = ((0.2 + 1) / 3 + (0.2 + 2) / 3) + 0.2 / 3;
    CHECK(v[5] == e0);
    CHECK(v[6] == e1);
  }
}

TEST_CASE("average_parameters on a subgroup: members averaged, others untouched", "[averagers]") {
  std::mutex m;
  std::map<int, float> out;
  simulate(3, [&](RankContext& ctx) {
    ProcessGroup g = ctx.world().new_group({0, 1});
    Tensor p = Tensor::full({4}, static_cast<double>(ctx.rank()));
    average_parameters({p}, g);
    std::lock_guard<std::mutex> lock(m);
    out[ctx.rank()] = static_cast<float>(p.at(3));
  });
  CHECK(out[0] == 0.5f);
  CHECK(out[1] == 0.5f);
  CHECK(out[2] == 2.0f);
}

TEST_CASE("HierarchicalModelAverager {2:2, 4:4, 8:4}, warmup 10, world 4: real subgroups, absolute steps",
          "[averagers]") {
  std::mutex m;
  std::map<int, std::vector<float>> seen;  // element 0 per step
  std::map<int, std::vector<int>> pair_ranks;
  simulate(4, [&](RankContext& ctx) {
    HierarchicalModelAverager avg({{2, 2}, {4, 4}, {8, 4}}, 10, ctx.world());
    std::vector<float> mine;
    for (int step = 0; step < 25; ++step) {
      Tensor p = rank_tensor(ctx.rank(), 0.0f, 3);
      avg.average_parameters(std::vector<Tensor>{p});
      mine.push_back(static_cast<float>(p.at(0)));
    }
    std::lock_guard<std::mutex> lock(m);
    seen[ctx.rank()] = mine;
    pair_ranks[ctx.rank()] = avg.period_process_groups().at(2).ranks();
    if (avg.period_process_groups().at(4).id() != ctx.world().id()) pair_ranks[ctx.rank()].push_back(-1);
  });
  CHECK(pair_ranks[0] == std::vector<int>{0, 1});
  CHECK(pair_ranks[1] == std::vector<int>{0, 1});
  CHECK(pair_ranks[2] == std::vector<int>{2, 3});
  CHECK(pair_ranks[3] == std::vector<int>{2, 3});
  const float global = avg_of(0.0f, 0, 3, {0, 1, 2, 3});
  for (int r = 0; r < 4; ++r)
    for (int step = 0; step < 25; ++step) {
      float expect = static_cast<float>(r);
      if (step >= 10) {
        if (step % 8 == 0 || step % 4 == 0) expect = global;
        else if (step % 2 == 0) expect = r < 2 ? avg_of(0.0f, 0, 3, {0, 1}) : avg_of(0.0f, 0, 3, {2, 3});
      }
      INFO("rank " << r << " step " << step);
      CHECK(seen[r][static_cast<std::size_t>(step)] == expect);
    }
  // Spot checks of the spec's list: 16, 24 global; 12, 20 4-group; 10, 14, 18, 22 pairs; others unchanged.
  CHECK(seen[3][16] == global);
  CHECK(seen[3][12] == global);
  CHECK(seen[3][14] == 2.5f);
  CHECK(seen[3][15] == 3.0f);
  CHECK(seen[0][10] == 0.5f);
}

TEST_CASE("Hierarchical vs periodic: absolute vs warm-up-relative steps", "[averagers]") {
  std::vector<std::int64_t> h, p;
  simulate(2, [&](RankContext& ctx) {
    HierarchicalModelAverager ha({{3, 2}}, 2, ctx.world());
    PeriodicModelAverager pa(3, 2, ctx.world());
    std::vector<std::int64_t> hs, ps;
    for (std::int64_t s = 0; s < 12; ++s) {
      if (ha.group_for_step(s)) hs.push_back(s);
      if (pa.group_for_step(s)) ps.push_back(s);
    }
    if (ctx.rank() == 0) h = hs, p = ps;
  });
  CHECK(h == std::vector<std::int64_t>{3, 6, 9});
  CHECK(p == std::vector<std::int64_t>{2, 5, 8, 11});
}

TEST_CASE("averager errors: bad periods, warmups and group sizes", "[averagers]") {
  simulate(4, [&](RankContext& ctx) {
    ProcessGroup w = ctx.world();
    bool ok = true;
    auto expect_value_error = [&](auto&& f) {
      try {
        f();
        ok = false;
      } catch (const ValueError&) {
      }
    };
    expect_value_error([&] { PeriodicModelAverager(4, -1, w); });
    expect_value_error([&] { PeriodicModelAverager(0, 0, w); });
    expect_value_error([&] { PeriodicModelAverager(-3, 0, w); });
    expect_value_error([&] { PeriodicModelAverager(2, 0, ProcessGroup{}); });
    expect_value_error([&] { HierarchicalModelAverager({}, 0, w); });
    expect_value_error([&] { HierarchicalModelAverager({{0, 2}, {4, 4}}, 0, w); });
    expect_value_error([&] { HierarchicalModelAverager({{2, 2}, {4, 2}}, 0, w); });   // last != world
    expect_value_error([&] { HierarchicalModelAverager({{2, 3}, {4, 4}}, 0, w); });   // 3 does not divide 4
    expect_value_error([&] { HierarchicalModelAverager({{2, 0}, {4, 4}}, 0, w); });
    expect_value_error([&] { HierarchicalModelAverager({{2, 2}, {4, 4}}, -1, w); });  // after the subgroups
    if (!ok) throw StateError("test", "an expected ValueError was not thrown");
  });
  // set_step rejects negatives.
  simulate(2, [&](RankContext& ctx) {
    PeriodicModelAverager a(2, 0, ctx.world());
    bool threw = false;
    try {
      a.set_step(-1);
    } catch (const ValueError&) {
      threw = true;
    }
    if (!threw) throw StateError("test", "set_step(-1) did not throw");
  });
}
