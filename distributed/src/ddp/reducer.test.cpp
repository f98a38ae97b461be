// Reducer (DDP gradient reduction) and comm hooks over simulated ranks:
// bucket assignment and launch order, overlap, each hook against an
// independent computation, no_sync, post-local SGD parity with plain data
// parallelism, errors, Join. Rank functions record; Catch asserts afterwards.
#include <catch2/catch.hpp>

#include <map>
#include <mutex>
#include <vector>

#include "dopt/actors/join.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/optim/sgd.hpp"
#include "reference_data.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

std::vector<Tensor> params_of(const std::vector<int>& sizes, int seed = 1) {
  std::vector<Tensor> ps;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    ps.push_back(testing::tensor_of(testing::values<float>(static_cast<std::size_t>(sizes[k]), seed + static_cast<int>(k))));
  return ps;
}

std::vector<float> grad_values(int numel, int rank, int step, int k) {
  return testing::values<float>(static_cast<std::size_t>(numel), 5000 + 101 * rank + 17 * step + k);
}

void set_grads(const std::vector<Tensor>& ps, int rank, int step) {
  for (std::size_t k = 0; k < ps.size(); ++k)
    ps[k].set_grad(testing::tensor_of(grad_values(static_cast<int>(ps[k].numel()), rank, step, static_cast<int>(k))));
}

// sum_r g_r / n in rank order (the process group's reduction order).
float mean_ref(const std::vector<float>& per_rank) {
  const float n = static_cast<float>(per_rank.size());
  float acc = per_rank[0] / n;
  for (std::size_t r = 1; r < per_rank.size(); ++r) acc = acc + per_rank[r] / n;
  return acc;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw StateError("test", what);
}

}  // namespace

TEST_CASE("Reducer buckets: per-dtype size caps over registration order, list reversed (DDP)", "[reducer]") {
  simulate(2, [&](RankContext& ctx) {
    auto ps = params_of({4, 4, 4, 4, 4, 4});  // 16 bytes each
    Reducer r(ps, ctx.world(), ReducerOptions{.bucket_cap_bytes = 40, .first_bucket_cap_bytes = 16});
    // forward: [0] (16 >= 16), [1,2,3] (48 >= 40), [4,5]; reversed.
    require(r.bucket_indices() == std::vector<std::vector<std::size_t>>{{4, 5}, {1, 2, 3}, {0}}, "bucket order");
    Reducer big(ps, ctx.world());
    require(big.bucket_indices() == std::vector<std::vector<std::size_t>>{{0, 1, 2, 3, 4, 5}}, "one bucket by default");
    // Mixed dtypes go to separate buckets.
    std::vector<Tensor> mixed = {ps[0], Tensor::zeros({3}, DType::float64), ps[1]};
    Reducer m(mixed, ctx.world());
    require(m.bucket_indices() == std::vector<std::vector<std::size_t>>{{1}, {0, 2}}, "dtype buckets");
  });
}

TEST_CASE("Reducer overlap: a full bucket's reduction starts before the last gradient is marked", "[reducer]") {
  for (bool overlap : {true, false}) {
    std::mutex m;
    std::vector<std::vector<std::size_t>> invoked_before;  // per rank: hook calls seen at each mark
    simulate(3, [&](RankContext& ctx) {
      auto ps = params_of({4, 4, 4, 4, 4, 4});
      Reducer r(ps, ctx.world(), ReducerOptions{.bucket_cap_bytes = 40, .first_bucket_cap_bytes = 16, .overlap = overlap});
      std::vector<std::size_t> order;  // bucket indices in hook-call order
      auto inner = allreduce_hook(ctx.world());
      r.register_comm_hook([&](GradBucket& b) {
        order.push_back(b.index());
        return inner(b);
      });
      set_grads(ps, ctx.rank(), 0);
      std::vector<std::size_t> seen;
      // Bucket 1 ({1,2,3}) completes first but must wait for bucket 0 ({4,5}).
      for (int i : {1, 2, 3, 5, 4, 0}) {
        r.mark_ready(ps[static_cast<std::size_t>(i)]);
        seen.push_back(order.size());
      }
      r.finalize();
      seen.push_back(order.size());
      require(order == std::vector<std::size_t>{0, 1, 2}, "buckets launch in index order");
      std::lock_guard<std::mutex> lock(m);
      invoked_before.push_back(seen);
    });
    for (const auto& s : invoked_before) {
      if (overlap) CHECK(s == std::vector<std::size_t>{0, 0, 0, 0, 2, 3, 3});
      else CHECK(s == std::vector<std::size_t>{0, 0, 0, 0, 0, 0, 3});
    }
  }
}

TEST_CASE("allreduce_hook (default): grads = sum_r g_r / n, bitwise (world 2, 3, 5)", "[reducer]") {
  for (int world : {2, 3, 5}) {
    std::mutex m;
    std::map<int, std::vector<std::vector<float>>> out;
    simulate(world, [&](RankContext& ctx) {
      auto ps = params_of({7, 1, 33});
      Reducer r(ps, ctx.world(), ReducerOptions{.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 8});
      set_grads(ps, ctx.rank(), 3);
      for (int i : {2, 1, 0}) r.mark_ready(ps[static_cast<std::size_t>(i)]);
      r.finalize();
      std::vector<std::vector<float>> g;
      for (auto& p : ps) g.push_back(p.grad().to_vector<float>());
      std::lock_guard<std::mutex> lock(m);
      out[ctx.rank()] = g;
    });
    const std::vector<int> sizes = {7, 1, 33};
    for (int rank = 0; rank < world; ++rank)
      for (int k = 0; k < 3; ++k)
        for (int e = 0; e < sizes[static_cast<std::size_t>(k)]; ++e) {
          std::vector<float> per;
          for (int s = 0; s < world; ++s) per.push_back(grad_values(sizes[static_cast<std::size_t>(k)], s, 3, k)[static_cast<std::size_t>(e)]);
          INFO("world " << world << " rank " << rank << " param " << k << " element " << e);
          CHECK(out[rank][static_cast<std::size_t>(k)][static_cast<std::size_t>(e)] == mean_ref(per));
        }
  }
}

TEST_CASE("fp16/bf16_compress_hook: cast, divide in 16 bits, sum, cast back", "[reducer]") {
  for (DType wire : {DType::float16, DType::bfloat16}) {
    const int world = 3;
    std::mutex m;
    std::map<int, std::vector<float>> out;
    simulate(world, [&](RankContext& ctx) {
      auto ps = params_of({19});
      Reducer r(ps, ctx.world());
      r.register_comm_hook(wire == DType::float16 ? fp16_compress_hook(ctx.world()) : bf16_compress_hook(ctx.world()));
      set_grads(ps, ctx.rank(), 1);
      r.mark_ready(ps[0]);
      r.finalize();
      std::lock_guard<std::mutex> lock(m);
      out[ctx.rank()] = ps[0].grad().to_vector<float>();
    });
    auto round16 = [&](float f) {
      return wire == DType::float16 ? static_cast<float>(Half(f)) : static_cast<float>(BFloat16(f));
    };
    for (int e = 0; e < 19; ++e) {
      float acc = 0.0f;  // the process group accumulates 16-bit floats in float32, rounds once
      for (int s = 0; s < world; ++s) {
        const float h = round16(grad_values(19, s, 1, 0)[static_cast<std::size_t>(e)]);
        const float d = round16(h / static_cast<float>(world));
        acc = s == 0 ? d : acc + d;
      }
      const float expect = round16(acc);
      for (int rank = 0; rank < world; ++rank) CHECK(out[rank][static_cast<std::size_t>(e)] == expect);
    }
  }
}

TEST_CASE("post_localSGD_hook: global until start_localSGD_iter, then the subgroup, iter stops there", "[reducer]") {
  for (bool allreduce_after : {true, false}) {
    std::mutex m;
    std::map<int, std::vector<float>> out;  // element 0 of the grad per iteration
    std::vector<std::int64_t> iters;
    simulate(4, [&](RankContext& ctx) {
      auto ps = params_of({5, 3});
      Reducer r(ps, ctx.world(), ReducerOptions{.bucket_cap_bytes = 20, .first_bucket_cap_bytes = 20});  // two buckets
      auto pairs = ctx.world().new_subgroups(2);
      auto state = std::make_shared<PostLocalSGDState>(ctx.world(), pairs.current, 3, allreduce_after);
      r.register_comm_hook(post_localSGD_hook(state));
      std::vector<float> mine;
      for (int it = 0; it < 6; ++it) {
        set_grads(ps, ctx.rank(), it);
        r.mark_ready(ps[1]);
        r.mark_ready(ps[0]);
        r.finalize();
        mine.push_back(static_cast<float>(ps[0].grad().at(0)));
      }
      std::lock_guard<std::mutex> lock(m);
      out[ctx.rank()] = mine;
      iters.push_back(state->iter);
    });
    for (auto i : iters) CHECK(i == 3);
    for (int rank = 0; rank < 4; ++rank)
      for (int it = 0; it < 6; ++it) {
        std::vector<float> per;
        if (it < 3)
          for (int s = 0; s < 4; ++s) per.push_back(grad_values(5, s, it, 0)[0]);
        else if (allreduce_after)
          for (int s = rank / 2 * 2; s < rank / 2 * 2 + 2; ++s) per.push_back(grad_values(5, s, it, 0)[0]);
        const float expect = per.empty() ? grad_values(5, rank, it, 0)[0] : mean_ref(per);
        INFO("rank " << rank << " iteration " << it << " allreduce_after " << allreduce_after);
        CHECK(out[rank][static_cast<std::size_t>(it)] == expect);
      }
  }
}

TEST_CASE("no_sync: local accumulation, no communication, then one reduction of the sums", "[reducer]") {
  const int world = 3;
  std::mutex m;
  std::map<int, std::vector<float>> out;
  std::vector<std::size_t> hook_calls;
  simulate(world, [&](RankContext& ctx) {
    auto ps = params_of({6});
    Reducer r(ps, ctx.world());
    std::size_t calls = 0;
    auto inner = allreduce_hook(ctx.world());
    r.register_comm_hook([&](GradBucket& b) {
      ++calls;
      return inner(b);
    });
    std::vector<float> acc(6, 0.0f);
    {
      auto guard = r.no_sync();
      for (int it = 0; it < 2; ++it) {
        auto g = grad_values(6, ctx.rank(), it, 0);
        for (int e = 0; e < 6; ++e) acc[static_cast<std::size_t>(e)] += g[static_cast<std::size_t>(e)];
        ps[0].set_grad(testing::tensor_of(acc));
        r.mark_ready(ps[0]);
        r.finalize();
        require(ps[0].grad().to_vector<float>() == acc, "no_sync must not touch the gradient");
      }
    }
    require(calls == 0 && r.require_sync(), "no communication under no_sync");
    auto g = grad_values(6, ctx.rank(), 2, 0);
    for (int e = 0; e < 6; ++e) acc[static_cast<std::size_t>(e)] += g[static_cast<std::size_t>(e)];
    ps[0].set_grad(testing::tensor_of(acc));
    r.mark_ready(ps[0]);
    r.finalize();
    std::lock_guard<std::mutex> lock(m);
    out[ctx.rank()] = ps[0].grad().to_vector<float>();
    hook_calls.push_back(calls);
  });
  for (auto c : hook_calls) CHECK(c == 1);
  for (int e = 0; e < 6; ++e) {
    std::vector<float> per;
    for (int s = 0; s < world; ++s) {
      float a = 0.0f;
      for (int it = 0; it < 3; ++it) a += grad_values(6, s, it, 0)[static_cast<std::size_t>(e)];
      per.push_back(a);
    }
    for (int rank = 0; rank < world; ++rank) CHECK(out[rank][static_cast<std::size_t>(e)] == mean_ref(per));
  }
}

TEST_CASE("parity: post-local SGD with subgroup = world equals plain data parallelism step for step", "[reducer]") {
  for (int world : {2, 3, 4, 5}) {
    std::mutex m;
    int grad_mismatch = 0, param_mismatch = 0;
    double max_param_diff = 0.0;
    simulate(world, [&](RankContext& ctx) {
      auto a = params_of({9, 4, 17}, 3);
      auto b = params_of({9, 4, 17}, 3);
      Reducer ra(a, ctx.world(), ReducerOptions{.bucket_cap_bytes = 40, .first_bucket_cap_bytes = 40});
      Reducer rb(b, ctx.world(), ReducerOptions{.bucket_cap_bytes = 40, .first_bucket_cap_bytes = 40});
      SGD plain(a, SGDOptions(0.05).momentum(0.9));
      PostLocalSGDConfig cfg(ctx.world());
      cfg.subgroup = ctx.world();
      cfg.start_localSGD_iter = 5;
      cfg.period = 2;
      auto state = cfg.make_hook_state();
      rb.register_comm_hook(post_localSGD_hook(state));
      PostLocalSGDOptimizer plsgd(std::make_unique<SGD>(b, SGDOptions(0.05).momentum(0.9)), cfg.make_averager(), *state);
      int gm = 0, pm = 0;
      double md = 0.0;
      for (int step = 0; step < 12; ++step) {
        set_grads(a, ctx.rank(), step);
        set_grads(b, ctx.rank(), step);
        for (int i : {2, 1, 0}) {
          ra.mark_ready(a[static_cast<std::size_t>(i)]);
          rb.mark_ready(b[static_cast<std::size_t>(i)]);
        }
        ra.finalize();
        rb.finalize();
        for (std::size_t k = 0; k < a.size(); ++k) gm += a[k].grad().equal(b[k].grad()) ? 0 : 1;
        plain.step();
        plsgd.step();
        for (std::size_t k = 0; k < a.size(); ++k) {
          pm += a[k].equal(b[k]) ? 0 : 1;
          md = std::max(md, a[k].max_abs_diff(b[k]));
        }
      }
      std::lock_guard<std::mutex> lock(m);
      grad_mismatch += gm;
      param_mismatch += pm;
      max_param_diff = std::max(max_param_diff, md);
    });
    INFO("world " << world);
    CHECK(grad_mismatch == 0);  // the hook's gradients are always the global average
    // Averaging identical replicas returns them bitwise when n is a power of two
    // (p / n exact); for other n, sum_r p / n may differ from p in the last bit.
    if (world == 2 || world == 4) CHECK(param_mismatch == 0);
    else CHECK(max_param_diff < 1e-5);
  }
}

TEST_CASE("Reducer errors: marked twice, unknown param, unmarked at finalize, late hook, bad construction",
          "[reducer]") {
  simulate(2, [&](RankContext& ctx) {
    auto ps = params_of({3, 3});
    Reducer r(ps, ctx.world());
    set_grads(ps, ctx.rank(), 0);
    r.mark_ready(ps[0]);
    bool twice = false, unknown = false, unmarked = false, late = false, dup = false, shape = false;
    try { r.mark_ready(ps[0]); } catch (const StateError&) { twice = true; }
    try { r.mark_ready(Tensor::zeros({3})); } catch (const ValueError&) { unknown = true; }
    try { r.finalize(); } catch (const StateError&) { unmarked = true; }
    try { r.register_comm_hook(allreduce_hook(ctx.world())); } catch (const StateError&) { late = true; }
    try { Reducer bad({ps[0], ps[0]}, ctx.world()); } catch (const ValueError&) { dup = true; }
    ps[1].set_grad(Tensor());
    Tensor odd = Tensor::zeros({2, 2});
    Tensor q = Tensor::zeros({3});
    Reducer r2({q}, ctx.world(), ReducerOptions{.broadcast_parameters = false});
    q.set_grad(Tensor::zeros({3}));
    q.set_data(odd);  // the parameter changed shape under the reducer (its grad did not)
    try { r2.mark_ready(q); } catch (const ShapeError&) { shape = true; }
    require(twice && unknown && unmarked && late && dup && shape, "an expected error was not thrown");
    // After the failed finalize the reducer starts a fresh iteration and still works.
    set_grads(ps, ctx.rank(), 1);
    r.mark_ready(ps[1]);
    r.mark_ready(ps[0]);
    r.finalize();
  });
  // find_unused_parameters: unmarked parameters are reduced as zeros.
  std::vector<float> got;
  simulate(2, [&](RankContext& ctx) {
    auto ps = params_of({2, 2});
    Reducer r(ps, ctx.world(), ReducerOptions{.find_unused_parameters = true});
    ps[0].set_grad(Tensor::full({2}, 4.0));
    if (ctx.rank() == 0) ps[1].set_grad(Tensor::full({2}, 2.0));
    r.mark_ready(ps[0]);
    if (ctx.rank() == 0) r.mark_ready(ps[1]);
    r.finalize();
    if (ctx.rank() == 1) got = ps[1].grad().to_vector<float>();
  });
  CHECK(got == std::vector<float>{1.0f, 1.0f});
}

TEST_CASE("Reducer is Joinable: a rank with fewer inputs shadows the bucket all-reduces", "[reducer]") {
  const int world = 3;
  std::mutex m;
  std::map<int, std::vector<float>> out;
  simulate(world, [&](RankContext& ctx) {
    auto ps = params_of({4, 4});
    Reducer r(ps, ctx.world(), ReducerOptions{.bucket_cap_bytes = 16, .first_bucket_cap_bytes = 16});
    Join join({&r});
    const int my_iters = ctx.rank() == 2 ? 1 : 3;  // rank 2 runs out first
    std::vector<float> mine;
    for (int it = 0; it < my_iters; ++it) {
      for (auto& p : ps) p.set_grad(Tensor::full({4}, 3.0 * (ctx.rank() + 1)));
      r.mark_ready(ps[1]);
      r.mark_ready(ps[0]);
      r.finalize();
      mine.push_back(static_cast<float>(ps[0].grad().at(0)));
    }
    join.finish();
    std::lock_guard<std::mutex> lock(m);
    out[ctx.rank()] = mine;
  });
  // Iteration 0: (3 + 6 + 9) / 3 = 6 (each divided first); later: rank 2 contributes zeros.
  const float it0 = 3.0f / 3 + 6.0f / 3 + 9.0f / 3;
  const float later = 3.0f / 3 + 6.0f / 3 + 0.0f;
  CHECK(out[0] == std::vector<float>{it0, later, later});
  CHECK(out[1] == std::vector<float>{it0, later, later});
  CHECK(out[2] == std::vector<float>{it0});
}
