// DiLoCoAverager over simulated ranks (2, 3, 5): against an independent float64
// reference of the algorithm (fragments, delay, alpha, outer Nesterov SGD),
// parity with PeriodicModelAverager, the quantized wire formats, error
// feedback, state dict round trips mid-run (bitwise equal to an uninterrupted
// run), a lost peer, and the option checks.
// Rank functions record; Catch assertions run after simulate() returned.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "diloco_case.hpp"
#include "diloco_reference.hpp"
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/averagers.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/sgd.hpp"
#include "dopt/runtime/state_dict.hpp"

using namespace dopt;
using namespace dopt::optim;

namespace {

using diloco_ref::init_params;
using diloco_ref::options_of;
using diloco_ref::set_grads;

struct Built {
  std::vector<Tensor> params;
  DiLoCoAverager* diloco = nullptr;
  std::unique_ptr<PostLocalSGDOptimizer> opt;
};

Built build(const diloco_ref::Config& c, const DiLoCoOptions& o, ProcessGroup g, DType dt) {
  Built b;
  b.params = init_params(c, dt);
  auto inner = std::make_unique<SGD>(b.params, SGDOptions(c.inner_lr).momentum(c.inner_momentum));
  auto avg = std::make_unique<DiLoCoAverager>(b.params, o, std::move(g));
  b.diloco = avg.get();
  b.opt = std::make_unique<PostLocalSGDOptimizer>(std::move(inner), std::move(avg));
  return b;
}

/// Largest |got - want| over all steps, ranks, parameters (params and anchors).
struct Compare {
  std::mutex m;
  double max_err = 0;
  int checked = 0;
  void add(const Tensor& got, const std::vector<double>& want) {
    const Tensor d = got.to(DType::float64);
    double e = 0;
    for (std::size_t k = 0; k < want.size(); ++k) e = std::max(e, std::fabs(d.data<double>()[k] - want[k]));
    std::lock_guard<std::mutex> lock(m);
    max_err = std::max(max_err, e);
    ++checked;
  }
};

/// Runs c with world ranks through PostLocalSGDOptimizer + DiLoCoAverager and
/// compares every step with the float64 reference.
void against_reference(const diloco_ref::Config& c, DType dt, double tol) {
  const diloco_ref::Trace ref = diloco_ref::run(c);
  Compare cmp;
  simulate(c.world, [&](RankContext& ctx) {
    Built b = build(c, options_of(c), ctx.world(), dt);
    for (int t = 0; t < c.steps; ++t) {
      set_grads(c, ctx.rank(), t, b.params);
      b.opt->step();
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        cmp.add(b.params[i], ref.params[static_cast<std::size_t>(t)][static_cast<std::size_t>(ctx.rank())][i]);
        cmp.add(b.diloco->anchors()[i], ref.anchors[static_cast<std::size_t>(t)][i]);
      }
    }
  });
  INFO("world " << c.world << ", max error " << cmp.max_err);
  CHECK(cmp.checked == c.world * c.steps * static_cast<int>(c.numels.size()) * 2);
  CHECK(cmp.max_err <= tol);
}

}  // namespace

TEST_CASE("DiLoCo matches a float64 reference: one fragment, outer Nesterov SGD (world 2, 3, 5)", "[diloco]") {
  for (int world : {2, 3, 5}) {
    diloco_ref::Config c;
    c.world = world;
    c.sync_every = 3;
    c.steps = 10;
    against_reference(c, DType::float64, 1e-12);
    against_reference(c, DType::float32, 2e-5);
  }
}

TEST_CASE("Streaming DiLoCo matches the reference: fragments, delay, alpha (world 2, 3, 5)", "[diloco]") {
  struct V {
    std::int64_t sync_every, delay;
    double alpha;
    std::vector<std::vector<std::int64_t>> frags;
  };
  for (const V& v : {V{4, 1, 0.5, {{0, 2}, {3, 1}}}, V{6, 1, 0.0, {{1}, {0, 3}, {2}}}, V{8, 3, 0.75, {{2, 0}, {1, 3}}}, V{6, 1, 1.0, {{3, 2, 1, 0}}},
                     V{4, 0, 0.25, {{0}, {1}, {2}, {3}}}}) {
    for (int world : {2, 3, 5}) {
      diloco_ref::Config c;
      c.world = world;
      c.sync_every = v.sync_every;
      c.delay = v.delay;
      c.alpha = v.alpha;
      c.fragments = v.frags;
      c.steps = 17;
      INFO("sync_every " << v.sync_every << " delay " << v.delay << " alpha " << v.alpha << " fragments "
                         << v.frags.size());
      against_reference(c, DType::float64, 1e-12);
    }
  }
}

TEST_CASE("DiLoCo with outer SGD(lr 1, no momentum) is PeriodicModelAverager (world 2, 3, 4, 5)", "[diloco]") {
  // Inner SGD lr 1/8 on gradients k/16 keeps every value a short dyadic
  // fraction, so both averages are exact at 2 and 4 ranks and must agree bit
  // for bit; at 3 and 5 ranks the division rounds (torch's averager divides
  // first, DiLoCo sums first): at most a few ulp apart.
  for (int world : {2, 3, 4, 5}) {
    const std::int64_t H = 3;
    const int steps = 10;
    std::mutex m;
    double max_err = 0;
    int compared = 0;
    simulate(world, [&](RankContext& ctx) {
      auto make = [&] {
        std::vector<Tensor> ps;
        for (int i = 0; i < 3; ++i) {
          std::vector<float> v;
          for (int e = 0; e < 9; ++e) v.push_back(static_cast<float>((i * 9 + e) % 7 - 3));
          ps.push_back(Tensor::from_vector(v));
        }
        return ps;
      };
      std::vector<Tensor> a = make(), b = make();
      DiLoCoOptions o;
      o.sync_every = H;
      o.outer_optimizer = {"SGD", {{"lr", 1.0}, {"momentum", 0.0}}};
      PostLocalSGDOptimizer da(std::make_unique<SGD>(a, SGDOptions(0.125)),
                               std::make_unique<DiLoCoAverager>(a, o, ctx.world()));
      PostLocalSGDOptimizer pa(std::make_unique<SGD>(b, SGDOptions(0.125)),
                               std::make_unique<PeriodicModelAverager>(H, H - 1, ctx.world()));
      for (int t = 0; t < steps; ++t) {
        for (int i = 0; i < 3; ++i) {
          std::vector<float> g;
          for (int e = 0; e < 9; ++e) g.push_back(static_cast<float>(((ctx.rank() + 1) * (t + 2) * (i + e + 1)) % 13 - 6) / 16.0f);
          a[static_cast<std::size_t>(i)].set_grad(Tensor::from_vector(g));
          b[static_cast<std::size_t>(i)].set_grad(Tensor::from_vector(g));
        }
        da.step();
        pa.step();
        for (int i = 0; i < 3; ++i) {
          const double d = a[static_cast<std::size_t>(i)].max_abs_diff(b[static_cast<std::size_t>(i)]);
          std::lock_guard<std::mutex> lock(m);
          max_err = std::max(max_err, d);
          ++compared;
        }
      }
    });
    INFO("world " << world << ", max |DiLoCo - PeriodicModelAverager| = " << max_err);
    CHECK(compared == world * steps * 3);
    if (world == 2 || world == 4) CHECK(max_err == 0.0);
    else CHECK(max_err <= 4e-6);  // values up to ~8: a few ulp of float32
  }
}

TEST_CASE("quantized_all_reduce: each wire format against a float64 reference of the same quantization "
          "(world 2, 3, 5)",
          "[diloco][wire]") {
  const std::int64_t N = 1000;  // not a multiple of the row size: short last rows
  for (WireFormat f : {WireFormat::float32, WireFormat::bfloat16, WireFormat::float16, WireFormat::int8,
                       WireFormat::int4}) {
    for (int world : {2, 3, 5}) {
      QuantizedAllReduceOptions o;
      o.format = f;
      o.row_size = 64;
      std::vector<std::vector<float>> inputs(static_cast<std::size_t>(world));
      for (int r = 0; r < world; ++r)
        for (std::int64_t e = 0; e < N; ++e) inputs[static_cast<std::size_t>(r)].push_back(diloco_ref::wire_input(r, e));
      const diloco_ref::WireReference ref = diloco_ref::wire_reference(inputs, f, o.row_size);
      std::mutex m;
      std::vector<std::vector<float>> got(static_cast<std::size_t>(world));
      std::vector<std::uint64_t> sent(static_cast<std::size_t>(world));
      simulate(world, [&](RankContext& ctx) {
        Tensor t = Tensor::from_vector(inputs[static_cast<std::size_t>(ctx.rank())]);
        const std::uint64_t b = quantized_all_reduce(ctx.world(), t, o);
        std::lock_guard<std::mutex> lock(m);
        got[static_cast<std::size_t>(ctx.rank())] = t.to_vector<float>();
        sent[static_cast<std::size_t>(ctx.rank())] = b;
      });
      INFO(wire_format_name(f) << ", world " << world);
      double worst = 0, worst_exact = 0;
      bool within = true, exact_within = true;
      for (std::int64_t e = 0; e < N; ++e) {
        const auto k = static_cast<std::size_t>(e);
        const double d = std::fabs(got[0][k] - ref.mean[k]);
        if (d > ref.tol1[k] + ref.tol2[k] + 1e-6 * (1 + std::fabs(ref.mean[k]))) within = false;
        worst = std::max(worst, d);
        const double de = std::fabs(got[0][k] - ref.exact[k]);
        if (de > 0.5 * (ref.tol1[k] + ref.tol2[k]) + 1e-6 * (1 + std::fabs(ref.exact[k]))) exact_within = false;
        worst_exact = std::max(worst_exact, de);
      }
      INFO("max |got - float64 reference| " << worst << ", max |got - exact mean| " << worst_exact);
      CHECK(within);
      CHECK(exact_within);  // rounding to nearest: half a quantum per stage
      for (int r = 1; r < world; ++r) CHECK(got[static_cast<std::size_t>(r)] == got[0]);  // same bytes decoded
      for (int r = 0; r < world; ++r)
        CHECK(sent[static_cast<std::size_t>(r)] == quantized_all_reduce_bytes(N, world, r, o));
      if (f == WireFormat::float32) CHECK(worst <= 1e-6);
    }
  }
}

TEST_CASE("quantized_all_reduce: wire bytes per format", "[diloco][wire]") {
  QuantizedAllReduceOptions o;
  o.row_size = 256;
  const std::int64_t N = 1 << 20;
  o.format = WireFormat::float32;
  const auto f32 = quantized_all_reduce_bytes(N, 4, 0, o);
  CHECK(f32 == static_cast<std::uint64_t>(2 * 3 * N / 4 * 4));  // 2 (n-1)/n of 4 N bytes
  o.format = WireFormat::bfloat16;
  CHECK(quantized_all_reduce_bytes(N, 4, 0, o) * 2 == f32);
  o.format = WireFormat::int8;
  const auto i8 = quantized_all_reduce_bytes(N, 4, 0, o);
  CHECK(static_cast<double>(i8) == Approx(f32 / 4.0 * (1.0 + 4.0 / 256)));
  o.format = WireFormat::int4;
  CHECK(static_cast<double>(quantized_all_reduce_bytes(N, 4, 0, o)) == Approx(f32 / 8.0 * (1.0 + 8.0 / 256)));
  CHECK(parse_wire_format("bf16") == WireFormat::bfloat16);
  CHECK(parse_wire_format("4bit") == WireFormat::int4);
  CHECK_THROWS_AS(parse_wire_format("int3"), ValueError);
}

TEST_CASE("quantized_all_reduce: error feedback makes repeated int4 averages unbiased (world 3)", "[diloco][wire]") {
  // The same inputs averaged 64 times: without error feedback every call
  // makes the same quantization error; with it the mean of the results
  // approaches the exact mean.
  const std::int64_t N = 300;
  const int calls = 64;
  double err_plain = 0, err_ef = 0;
  std::mutex m;
  for (bool ef : {false, true}) {
    simulate(3, [&](RankContext& ctx) {
      std::vector<float> x(static_cast<std::size_t>(N));
      for (std::int64_t e = 0; e < N; ++e) x[static_cast<std::size_t>(e)] = static_cast<float>(std::cos(0.11 * e * (ctx.rank() + 1)));
      QuantizedAllReduceOptions o;
      o.format = WireFormat::int4;
      o.row_size = 32;
      Tensor residual = Tensor::zeros({N});
      std::vector<double> mean(static_cast<std::size_t>(N), 0.0);
      for (int k = 0; k < calls; ++k) {
        Tensor t = Tensor::from_vector(x);
        quantized_all_reduce(ctx.world(), t, o, ef ? residual : Tensor());
        for (std::int64_t e = 0; e < N; ++e) mean[static_cast<std::size_t>(e)] += t.data<float>()[e] / calls;
      }
      if (ctx.rank() != 0) return;
      double err = 0;
      for (std::int64_t e = 0; e < N; ++e) {
        double exact = 0;
        for (int r = 0; r < 3; ++r) exact += std::cos(0.11 * e * (r + 1)) / 3;
        err += std::fabs(mean[static_cast<std::size_t>(e)] - exact) / N;
      }
      std::lock_guard<std::mutex> lock(m);
      (ef ? err_ef : err_plain) = err;
    });
  }
  INFO("mean abs error: plain " << err_plain << ", error feedback " << err_ef);
  CHECK(err_ef < 0.5 * err_plain);
}

TEST_CASE("DiLoCo with quantized wire formats stays within the quantization of the reference (world 3)",
          "[diloco][wire]") {
  const diloco_ref::Config c{.world = 3, .sync_every = 4, .fragments = {{0, 2}, {3, 1}}, .delay = 1, .steps = 12};
  const diloco_ref::Trace ref = diloco_ref::run(c);
  for (WireFormat f : {WireFormat::bfloat16, WireFormat::int8, WireFormat::int4}) {
    for (bool ef : {false, true}) {
      if (f == WireFormat::bfloat16 && ef) continue;
      std::mutex m;
      double max_err = 0;
      bool ranks_agree = true;
      std::vector<std::vector<float>> anchors0;
      std::uint64_t bytes = 0;
      simulate(3, [&](RankContext& ctx) {
        DiLoCoOptions o = options_of(c);
        o.wire_format = f;
        o.error_feedback = ef;
        o.row_size = 8;
        Built b = build(c, o, ctx.world(), DType::float32);
        for (int t = 0; t < c.steps; ++t) {
          set_grads(c, ctx.rank(), t, b.params);
          b.opt->step();
        }
        // Anchors: identical on every rank (decoded from the same bytes).
        std::vector<Tensor> gathered;
        for (int r = 0; r < 3; ++r) gathered.push_back(Tensor::empty({c.numels[0]}));
        ctx.world().all_gather(gathered, b.diloco->anchors()[0]);
        std::lock_guard<std::mutex> lock(m);
        for (int r = 1; r < 3; ++r) ranks_agree = ranks_agree && gathered[static_cast<std::size_t>(r)].equal(gathered[0]);
        for (std::size_t i = 0; i < b.params.size(); ++i) {
          const Tensor a = b.diloco->anchors()[i].to(DType::float64);
          for (std::int64_t e = 0; e < a.numel(); ++e)
            max_err = std::max(max_err, std::fabs(a.data<double>()[e] -
                                                  ref.anchors.back()[i][static_cast<std::size_t>(e)]));
        }
        if (ctx.rank() == 0) bytes = b.diloco->stats().bytes_sent;
      });
      INFO(wire_format_name(f) << (ef ? " with error feedback" : "") << ": max anchor error " << max_err
                               << ", bytes " << bytes);
      CHECK(ranks_agree);
      CHECK(bytes > 0);
      // Deltas here are ~0.1-1; the outer step is 0.7 * (1 + 0.9) x the average.
      CHECK(max_err < (f == WireFormat::int4 ? 0.5 : f == WireFormat::int8 ? 0.05 : 0.02));
      CHECK(max_err > 0);  // it did quantize
    }
  }
}

TEST_CASE("DiLoCo state dict: resume from a checkpoint is bit for bit the uninterrupted run (world 2, 3, 5)",
          "[diloco][checkpoint]") {
  const auto dir = std::filesystem::temp_directory_path() / "dopt-diloco-test";
  std::filesystem::create_directories(dir);
  struct V {
    WireFormat f;
    bool ef;
    std::int64_t delay;
  };
  for (const V& v : {V{WireFormat::float32, false, 1}, V{WireFormat::int8, true, 1}, V{WireFormat::int4, true, 0}}) {
    for (int world : {2, 3, 5}) {
      const diloco_ref::Config c{
          .world = world, .sync_every = 4, .fragments = {{0, 2}, {3, 1}}, .delay = v.delay, .steps = 15};
      DiLoCoOptions o = options_of(c);
      o.wire_format = v.f;
      o.error_feedback = v.ef;
      o.row_size = 8;
      std::mutex m;
      int mismatches = 0, compared = 0;
      // Cut after step 4 (between a prepare and its sync when delay = 1: an
      // average in flight) and after step 9.
      for (int cut : {4, 9}) {
        simulate(world, [&](RankContext& ctx) {
          const int r = ctx.rank();
          Built full = build(c, o, ctx.world(), DType::float32);
          Built first = build(c, o, ctx.world(), DType::float32);
          const auto file = (dir / ("r" + std::to_string(r) + "_w" + std::to_string(world) + ".safetensors")).string();
          for (int t = 0; t <= cut; ++t) {
            set_grads(c, r, t, first.params);
            first.opt->step();
          }
          save_state_dict(first.opt->state_dict(), file);
          std::vector<Tensor> saved_params;
          for (const auto& p : first.params) saved_params.push_back(p.clone());
          first = Built{};
          DiLoCoOptions o2 = o;
          o2.wire_tag = o.wire_tag + 16;  // runs beside `full`: other point-to-point tags
          Built resumed = build(c, o2, ctx.world(), DType::float32);
          for (std::size_t i = 0; i < saved_params.size(); ++i) resumed.params[i].copy_(saved_params[i]);
          resumed.opt->load_state_dict(load_state_dict(file));
          for (int t = 0; t < c.steps; ++t) {
            set_grads(c, r, t, full.params);
            full.opt->step();
            if (t > cut) {
              set_grads(c, r, t, resumed.params);
              resumed.opt->step();
              std::lock_guard<std::mutex> lock(m);
              for (std::size_t i = 0; i < full.params.size(); ++i) {
                ++compared;
                if (!full.params[i].equal(resumed.params[i]) ||
                    !full.diloco->anchors()[i].equal(resumed.diloco->anchors()[i]))
                  ++mismatches;
              }
            }
          }
        });
      }
      INFO(wire_format_name(v.f) << ", world " << world);
      CHECK(compared > 0);
      CHECK(mismatches == 0);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("DiLoCo: a lost peer fails the sync, names the peer and leaves the fragment at its anchor (world 3)",
          "[diloco][failure]") {
  for (WireFormat f : {WireFormat::float32, WireFormat::int8}) {
    std::mutex m;
    std::map<int, std::string> errors;
    std::map<int, bool> at_anchor;
    SimulateOptions so;
    so.timeout = std::chrono::milliseconds(20000);
    try {
      simulate(
          3,
          [&](RankContext& ctx) {
            diloco_ref::Config c;
            c.world = 3;
            c.sync_every = 4;  // H = 2: fragment 0 at steps 1, 5; fragment 1 at step 3
            c.fragments = {{0, 1}, {2, 3}};
            c.delay = 0;
            DiLoCoOptions o = options_of(c);
            o.wire_format = f;
            Built b = build(c, o, ctx.world(), DType::float32);
            // Steps 0..3: both fragments synchronised once each.
            for (int t = 0; t < 4; ++t) {
              set_grads(c, ctx.rank(), t, b.params);
              b.opt->step();
            }
            if (ctx.rank() == 2) throw ValueError("test", "rank 2 stops");
            set_grads(c, ctx.rank(), 4, b.params);
            b.opt->step();  // local step, no sync
            set_grads(c, ctx.rank(), 5, b.params);
            try {
              b.opt->step();  // syncs fragment 0: rank 2 is gone
            } catch (const Error& e) {
              std::lock_guard<std::mutex> lock(m);
              errors[ctx.rank()] = std::string(typeid(e).name()) + ": " + e.what();
              at_anchor[ctx.rank()] = b.params[0].equal(b.diloco->anchors()[0]) &&
                                      b.params[1].equal(b.diloco->anchors()[1]) &&
                                      !b.params[2].equal(b.diloco->anchors()[2]) &&
                                      b.diloco->stats().failed_syncs == 1 && b.diloco->stats().syncs == 2;
            }
          },
          so);
    } catch (const Error&) {
      // rank 2's own error
    }
    INFO(wire_format_name(f));
    REQUIRE(errors.size() == 2);
    for (int r : {0, 1}) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK(errors[r].find("PeerLost") != std::string::npos);
      CHECK(errors[r].find("2") != std::string::npos);
      CHECK(at_anchor[r]);
    }
  }
}

TEST_CASE("DiLoCo option checks", "[diloco]") {
  simulate(1, [](RankContext& ctx) {
    std::vector<Tensor> ps{Tensor::zeros({3}), Tensor::zeros({2})};
    auto make = [&](DiLoCoOptions o) { DiLoCoAverager a(ps, o, ctx.world()); };
    DiLoCoOptions o;
    o.sync_every = 0;
    CHECK_THROWS_AS(make(o), ValueError);
    o = {};
    o.sync_every = 3;
    o.fragments = {{0}, {1}};
    CHECK_THROWS_WITH(make(o), Catch::Contains("multiple of the number of fragments"));
    o.sync_every = 4;
    o.fragment_sync_delay = 2;
    CHECK_THROWS_WITH(make(o), Catch::Contains("fragment_sync_delay"));
    o.fragment_sync_delay = 1;
    o.fragments = {{0, 1}, {1}};
    CHECK_THROWS_WITH(make(o), Catch::Contains("more than one fragment"));
    o.fragments = {{0}};
    CHECK_THROWS_WITH(make(o), Catch::Contains("in no fragment"));
    o.fragments = {{0}, {}};
    CHECK_THROWS_WITH(make(o), Catch::Contains("empty"));
    o.fragments = {};
    o.fragment_update_alpha = 1.5;
    CHECK_THROWS_WITH(make(o), Catch::Contains("fragment_update_alpha"));
    o.fragment_update_alpha = 0;
    o.error_feedback = true;
    CHECK_THROWS_WITH(make(o), Catch::Contains("error_feedback"));
    o.error_feedback = false;
    o.outer_optimizer = {"NoSuchOptimizer", {}};
    CHECK_THROWS_AS(make(o), ValueError);
    o.outer_optimizer = {"Adam", {{"lr", 0.1}}};  // any registered optimizer
    CHECK_NOTHROW(make(o));
    // A state dict without DiLoCo state.
    DiLoCoAverager a(ps, {}, ctx.world());
    StateDict sd;
    CHECK_THROWS_AS(a.load_state(sd), StateDictError);
  });
}

TEST_CASE("DiLoCo sharded checkpoints: each rank writes its share of the anchors and outer state, resume is bit "
          "for bit (world 3, an average in flight)",
          "[diloco][checkpoint]") {
  const auto dir = std::filesystem::temp_directory_path() / "dopt-diloco-sharded-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const diloco_ref::Config c{.world = 3, .sync_every = 4, .fragments = {{0, 2}, {3, 1}}, .delay = 1, .steps = 15};
  DiLoCoOptions o = options_of(c);
  o.wire_format = WireFormat::int8;
  o.error_feedback = true;
  o.row_size = 8;
  const int cut = 4;  // fragment 0's average starts after step 4 and is applied after step 5
  std::mutex m;
  int mismatches = 0, compared = 0;
  std::map<int, std::vector<std::int64_t>> anchors_in_shard;
  std::map<int, bool> local_has_anchor;
  simulate(3, [&](RankContext& ctx) {
    const int r = ctx.rank();
    const auto file = (dir / ("local" + std::to_string(r) + ".safetensors")).string();
    std::vector<Tensor> saved;
    {
      Built first = build(c, o, ctx.world(), DType::float32);
      first.diloco->set_sharded_checkpoints(true);
      for (int t = 0; t <= cut; ++t) {
        set_grads(c, r, t, first.params);
        first.opt->step();
      }
      const StateDict local = first.opt->state_dict();
      bool has = false;
      for (const auto& [i, st] : local.state) has = has || st.count("diloco.anchor");
      save_state_dict(local, file);
      first.diloco->save_sharded(dir.string());
      for (const auto& p : first.params) saved.push_back(p.clone());
      std::lock_guard<std::mutex> lock(m);
      local_has_anchor[r] = has;
    }
    ctx.world().barrier();  // every shard is written
    {
      const StateDict shard = load_state_dict((dir / DiLoCoAverager::shard_file_name(r, 3)).string());
      std::lock_guard<std::mutex> lock(m);
      for (const auto& [i, st] : shard.state)
        if (st.count("diloco.anchor")) anchors_in_shard[r].push_back(i);
    }
    Built full = build(c, o, ctx.world(), DType::float32);
    DiLoCoOptions o2 = o;
    o2.wire_tag = o.wire_tag + 16;  // runs beside `full`
    Built resumed = build(c, o2, ctx.world(), DType::float32);
    resumed.diloco->set_sharded_checkpoints(true);
    for (std::size_t i = 0; i < saved.size(); ++i) resumed.params[i].copy_(saved[i]);
    resumed.opt->load_state_dict(load_state_dict(file));
    resumed.diloco->load_sharded(dir.string());
    for (int t = 0; t < c.steps; ++t) {
      set_grads(c, r, t, full.params);
      full.opt->step();
      if (t <= cut) continue;
      set_grads(c, r, t, resumed.params);
      resumed.opt->step();
      std::lock_guard<std::mutex> lock(m);
      for (std::size_t i = 0; i < full.params.size(); ++i) {
        ++compared;
        if (!full.params[i].equal(resumed.params[i]) || !full.diloco->anchors()[i].equal(resumed.diloco->anchors()[i]))
          ++mismatches;
      }
    }
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK_FALSE(local_has_anchor[r]);  // the per-rank dict leaves the replicated state out
    std::vector<std::int64_t> want;
    for (std::int64_t i = r; i < 4; i += 3) want.push_back(i);
    CHECK(anchors_in_shard[r] == want);  // parameters i with i % 3 == r
  }
  CHECK(compared == 3 * (c.steps - cut - 1) * 4);
  CHECK(mismatches == 0);
  std::filesystem::remove_all(dir);
}
