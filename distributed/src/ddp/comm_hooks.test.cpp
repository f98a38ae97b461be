// GradBucket and the hooks called directly (no reducer), against
// independent computations.
#include <catch2/catch.hpp>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/comm_hooks.hpp"

using namespace dopt;
using namespace dopt::optim;

TEST_CASE("GradBucket: views, is_last, set_buffer checks", "[comm_hooks]") {
  Tensor p0 = Tensor::zeros({2, 2}), p1 = Tensor::zeros({3});
  Tensor buf = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7});
  GradBucket b(1, 2, buf, {p0, p1}, {0, 4});
  CHECK(b.is_last());
  CHECK(GradBucket(0, 2, buf, {p0, p1}, {0, 4}).is_last() == false);
  auto g = b.gradients();
  REQUIRE(g.size() == 2);
  CHECK(g[0].shape() == Shape{2, 2});
  CHECK(g[1].to_vector<float>() == std::vector<float>{5, 6, 7});
  CHECK_THROWS_AS(b.set_buffer(Tensor::zeros({6})), ShapeError);
  CHECK_THROWS_AS(b.set_buffer(Tensor::zeros({7}, DType::float64)), DTypeError);
  CHECK_THROWS_AS(GradBucket(2, 2, buf, {p0, p1}, {0, 4}), ValueError);
}

TEST_CASE("allreduce_hook divides first, then sums (world 2, 3, 5), a user hook sees the bucket", "[comm_hooks]") {
  for (int world : {2, 3, 5}) {
    std::mutex m;
    std::map<int, std::vector<float>> out;
    simulate(world, [&](RankContext& ctx) {
      Tensor p = Tensor::zeros({3});
      Tensor buf = Tensor::from_vector(std::vector<float>{0.1f * (ctx.rank() + 1), 1.0f + ctx.rank(), -0.7f});
      GradBucket b(0, 1, buf, {p}, {0});
      CommHook user = [inner = allreduce_hook(ctx.world())](GradBucket& bk) { return inner(bk); };
      Tensor r = user(b).get();
      std::lock_guard<std::mutex> lock(m);
      out[ctx.rank()] = r.to_vector<float>();
    });
    std::vector<float> base = {0.1f, 1.0f, -0.7f};
    for (int e = 0; e < 3; ++e) {
      float acc = 0.0f;
      for (int s = 0; s < world; ++s) {
        const float v = e == 0 ? 0.1f * (s + 1) : e == 1 ? 1.0f + s : -0.7f;
        acc = s == 0 ? v / world : acc + v / static_cast<float>(world);
      }
      for (int r = 0; r < world; ++r) CHECK(out[r][static_cast<std::size_t>(e)] == acc);
    }
  }
}

TEST_CASE("PostLocalSGDState: errors, iteration counting on the last bucket only", "[comm_hooks]") {
  simulate(2, [&](RankContext& ctx) {
    bool threw = false;
    try {
      PostLocalSGDState bad(ctx.world(), ProcessGroup{}, -1);
    } catch (const ValueError& e) {
      threw = true;
      if (e.rank() != ctx.rank() ||
          std::string(e.what()).find("[rank " + std::to_string(ctx.rank()) + "]") == std::string::npos)
        throw StateError("test", std::string("the error does not name the rank: ") + e.what());
    }
    if (!threw) throw StateError("test", "negative start_localSGD_iter accepted");
    PostLocalSGDState st(ctx.world(), ProcessGroup{}, 2);
    Tensor p = Tensor::zeros({1});
    GradBucket first(0, 2, Tensor::zeros({1}), {p}, {0}), last(1, 2, Tensor::zeros({1}), {p}, {0});
    st.maybe_increase_iter(first);
    st.maybe_increase_iter(last);
    if (st.iter != 1) throw StateError("test", "iter must count last buckets only");
  });
}

TEST_CASE("With owner segments the built-in hooks reduce each segment onto its owner: the owner's values are "
          "the whole-bucket hook's bits, the other segments are not all-reduced (world 3, 5)",
          "[comm_hooks]") {
  using Make = CommHook (*)(ProcessGroup);
  const std::vector<std::pair<const char*, Make>> hooks = {
      {"allreduce_hook", &allreduce_hook}, {"fp16_compress_hook", &fp16_compress_hook},
      {"bf16_compress_hook", &bf16_compress_hook}};
  for (int world : {3, 5}) {
    for (const auto& [name, make] : hooks) {
      DYNAMIC_SECTION(name << ", world " << world) {
        // 11 elements in segments of 4, 0, 5, 2 owned by ranks 1, 0, 2 % world, 0.
        const std::vector<GradBucket::Segment> segs = {{0, 4, 1}, {4, 0, 0}, {4, 5, 2 % world}, {9, 2, 0}};
        auto local = [](int rank) {
          std::vector<float> v;
          for (int e = 0; e < 11; ++e) v.push_back(0.37f * static_cast<float>(e + 1) - 0.11f * static_cast<float>(rank));
          return v;
        };
        std::mutex m;
        std::map<int, std::vector<float>> whole, owned;
        simulate(world, [&](RankContext& ctx) {
          Tensor p = Tensor::zeros({11});
          GradBucket a(0, 1, Tensor::from_vector(local(ctx.rank())), {p}, {0});
          GradBucket b(0, 1, Tensor::from_vector(local(ctx.rank())), {p}, {0});
          b.set_owner_segments(segs);
          CommHook hook = make(ctx.world());
          const Tensor ra = hook(a).get();
          const Tensor rb = hook(b).get();
          std::lock_guard<std::mutex> lock(m);
          whole[ctx.rank()] = ra.to_vector<float>();
          owned[ctx.rank()] = rb.to_vector<float>();
        });
        for (int r = 0; r < world; ++r)
          for (const auto& s : segs)
            for (std::int64_t e = s.offset; e < s.offset + s.numel; ++e) {
              const auto k = static_cast<std::size_t>(e);
              if (s.owner == r) {
                CHECK(owned[r][k] == whole[r][k]);  // the owner reads the sum, bit for bit
              } else if (std::string(name) != "allreduce_hook") {
                // A compress hook writes back only the owned segments: the rest keeps the rank's own value.
                CHECK(owned[r][k] == local(r)[k]);
              }
            }
        if (std::string(name) == "allreduce_hook") {
          // Without a write-back step, the non-owners' segments hold what the reduce left: not the sum
          // (an all-reduce would have given every rank the sum).
          int differ = 0;
          for (int r = 0; r < world; ++r)
            for (const auto& s : segs)
              if (s.owner != r)
                for (std::int64_t e = s.offset; e < s.offset + s.numel; ++e)
                  differ += owned[r][static_cast<std::size_t>(e)] != whole[r][static_cast<std::size_t>(e)];
          CHECK(differ > 0);
        }
      }
    }
  }
  simulate(1, [&](RankContext&) {
    GradBucket b(0, 1, Tensor::zeros({5}), {Tensor::zeros({5})}, {0});
    CHECK_THROWS_AS(b.set_owner_segments({{0, 2, 0}, {3, 2, 0}}), ValueError);  // a gap
    CHECK_THROWS_AS(b.set_owner_segments({{0, 2, 0}}), ValueError);             // short of the buffer
  });
}
