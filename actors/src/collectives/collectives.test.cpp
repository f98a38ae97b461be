// Collectives between simulated ranks. Rank functions run on their own
// threads, where Catch2 assertions are not allowed: they record what they
// found, and the test thread asserts after simulate() returned.
#include <catch2/catch.hpp>

#include "rank_checks.hpp"
#include "reductions.hpp"

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"

using dopt::DType;
using dopt::ReduceOp;
using dopt::Tensor;

namespace {

const DType kDTypes[] = {DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::int32, DType::int64};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::product, ReduceOp::min, ReduceOp::max};

// Input of rank r, element i: small integers (exact in every dtype).
double input_value(int r, std::int64_t i) { return static_cast<double>((r * 3 + i) % 5) - 2.0; }

Tensor make_input(int r, std::int64_t n, DType dt, std::int64_t salt = 0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = input_value(r, i + salt);
  return Tensor::from_vector(v).to(dt);
}

// Rounds x to dtype dt and back (what storing into a dt tensor does).
double round_to(double x, DType dt) { return Tensor::scalar(x, DType::float64).to(dt).item(); }

// The documented reduction, computed here from the formula: in rank order,
// in float32 for the 16-bit floats, in the dtype otherwise.
double expected_reduce(ReduceOp op, DType dt, int n, std::int64_t i, std::int64_t salt = 0) {
  double acc = dopt::testing::reduce_in_rank_order(op, n, [&](int r) { return input_value(r, i + salt); });
  if (op == ReduceOp::avg) acc = dopt::testing::avg_in(dt, acc, n);
  return round_to(acc, dt);
}

using Log = dopt::testing::RankLog;

void check_values(Log& log, const Tensor& t, const std::function<double(std::int64_t)>& want, const std::string& what) {
  bool ok = true;
  std::int64_t bad = -1;
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (t.at(i) != want(i)) {
      ok = false;
      bad = i;
      break;
    }
  log.check(ok, what + (ok ? "" : " wrong at element " + std::to_string(bad) + ": got " +
                                      std::to_string(t.at(bad)) + ", want " + std::to_string(want(bad))));
}

dopt::SimulateOptions with_runtime(dopt::Runtime& rt, const std::string& plane = "shm") {
  dopt::SimulateOptions o;
  o.runtime = &rt;
  o.plane = plane;
  return o;
}

}  // namespace

TEST_CASE("every collective, dtype and reduce op matches the reference", "[actors]") {
  dopt::Runtime rt(dopt::RuntimeOptions{});
  const std::string plane = GENERATE(as<std::string>{}, "shm", "actor");
  for (int world : {1, 2, 3, 5}) {
    DYNAMIC_SECTION("plane " << plane << ", world size " << world) {
      Log log;
      const std::int64_t n = 37;  // not divisible by the world sizes
      dopt::simulate(world, [&](dopt::RankContext& ctx) {
        auto& pg = ctx.world();
        const int r = ctx.rank();
        for (DType dt : kDTypes) {
          const std::string dn(dopt::dtype_name(dt));
          for (ReduceOp op : kOps) {
            if (op == ReduceOp::avg && !dopt::is_floating_point(dt)) continue;
            const std::string on(dopt::reduce_op_name(op));
            // all_reduce (2-D shape)
            Tensor t = make_input(r, n - 1, dt).view({4, 9});
            pg.all_reduce(t, op);
            check_values(log, t, [&](std::int64_t i) { return expected_reduce(op, dt, world, i); },
                         "all_reduce " + on + " " + dn);
            // reduce to the last rank; other ranks keep their input
            Tensor u = make_input(r, n, dt);
            pg.reduce(u, world - 1, op);
            if (r == world - 1)
              check_values(log, u, [&](std::int64_t i) { return expected_reduce(op, dt, world, i); },
                           "reduce " + on + " " + dn);
            else
              check_values(log, u, [&](std::int64_t i) { return round_to(input_value(r, i), dt); },
                           "reduce (non-dst unchanged) " + dn);
            // reduce_scatter: inputs[k] of rank r = input(r, salt k*n)
            std::vector<Tensor> ins;
            for (int k = 0; k < world; ++k) ins.push_back(make_input(r, n, dt, k * n));
            Tensor out = Tensor::zeros({n}, dt);
            pg.reduce_scatter(out, ins, op);
            check_values(log, out, [&](std::int64_t i) { return expected_reduce(op, dt, world, i, r * n); },
                         "reduce_scatter " + on + " " + dn);
          }
          // broadcast from the middle rank
          const int src = world / 2;
          Tensor b = make_input(r, n, dt);
          pg.broadcast(b, src);
          check_values(log, b, [&](std::int64_t i) { return round_to(input_value(src, i), dt); }, "broadcast " + dn);
          // all_gather into a list and into one tensor
          Tensor in = make_input(r, n, dt);
          std::vector<Tensor> outs;
          for (int k = 0; k < world; ++k) outs.push_back(Tensor::zeros({n}, dt));
          pg.all_gather(outs, in);
          for (int k = 0; k < world; ++k)
            check_values(log, outs[static_cast<std::size_t>(k)],
                         [&](std::int64_t i) { return round_to(input_value(k, i), dt); },
                         "all_gather[" + std::to_string(k) + "] " + dn);
          Tensor flat = Tensor::zeros({world * n}, dt);
          pg.all_gather_into_tensor(flat, in);
          check_values(log, flat, [&](std::int64_t i) { return round_to(input_value(static_cast<int>(i / n), i % n), dt); },
                       "all_gather_into_tensor " + dn);
          // the input is untouched by gathers
          check_values(log, in, [&](std::int64_t i) { return round_to(input_value(r, i), dt); }, "gather input " + dn);
          pg.barrier();
        }
      }, with_runtime(rt, plane));
      // 6 dtypes: 4 float x 5 ops + 2 int x 4 ops reductions, each 3 checks; plus world + 3 per dtype
      const long per_rank = (4 * 5 + 2 * 4) * 3 + 6 * (world + 3);
      CHECK(log.checks() == per_rank * world);
      log.report();
    }
  }
}

TEST_CASE("async collectives return futures, then() runs", "[actors]") {
  Log log;
  dopt::simulate(3, [&](dopt::RankContext& ctx) {
    auto& pg = ctx.world();
    std::vector<Tensor> ts;
    std::vector<dopt::Future<void>> fs;
    for (int k = 0; k < 8; ++k) {
      ts.push_back(Tensor::full({16}, ctx.rank() + k, DType::float32));
      fs.push_back(pg.all_reduce_async(ts.back()));
    }
    std::atomic<int> continued{0};
    auto last = fs.back().then([&](dopt::Future<void> f) {
      f.get();
      ++continued;
      return 7;
    });
    for (auto& f : fs) f.wait();
    log.check(last.get() == 7 && continued == 1, "then() ran once");
    for (int k = 0; k < 8; ++k) {
      log.check(fs[static_cast<std::size_t>(k)].is_ready(), "ready after wait");
      check_values(log, ts[static_cast<std::size_t>(k)], [&](std::int64_t) { return 3.0 * k + 3.0; },
                   "async all_reduce " + std::to_string(k));
    }
  });
  CHECK(log.checks() == 3 * (1 + 16));
  log.report();
}

TEST_CASE("float32 all_reduce is deterministic and in rank order", "[actors]") {
  const int world = 5;
  const std::int64_t n = 10007;
  std::vector<std::vector<float>> inputs(world);
  std::mt19937 gen(42);
  std::normal_distribution<float> dist(0.0f, 1e3f);
  for (auto& v : inputs) {
    v.resize(n);
    for (auto& x : v) x = dist(gen);
  }
  std::vector<float> want(n);
  for (std::int64_t i = 0; i < n; ++i) {
    float acc = inputs[0][static_cast<std::size_t>(i)];
    for (int r = 1; r < world; ++r) acc = acc + inputs[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
    want[static_cast<std::size_t>(i)] = acc;
  }
  dopt::Runtime rt(dopt::RuntimeOptions{});
  for (int run = 0; run < 3; ++run) {
    std::vector<std::vector<float>> got(world);
    dopt::simulate(world, [&](dopt::RankContext& ctx) {
      auto t = Tensor::from_vector(inputs[static_cast<std::size_t>(ctx.rank())]);
      ctx.world().all_reduce(t);
      got[static_cast<std::size_t>(ctx.rank())] = t.to_vector<float>();
    }, with_runtime(rt));
    for (int r = 0; r < world; ++r)
      CHECK(std::memcmp(got[static_cast<std::size_t>(r)].data(), want.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("send and recv", "[actors]") {
  Log log;
  for (int world : {2, 3, 5}) {
    dopt::simulate(world, [&](dopt::RankContext& ctx) {
      auto& pg = ctx.world();
      const int r = ctx.rank(), w = ctx.world_size();
      for (DType dt : kDTypes) {
        Tensor out = make_input(r, 11, dt);
        Tensor in = Tensor::zeros({11}, dt);
        auto sent = pg.send_async(out, (r + 1) % w, 5);
        pg.recv(in, (r + w - 1) % w, 5);
        sent.get();
        const int from = (r + w - 1) % w;
        check_values(log, in, [&](std::int64_t i) { return round_to(input_value(from, i), dt); },
                     "recv " + std::string(dopt::dtype_name(dt)));
      }
      // two messages on different tags, received in the opposite order
      if (r == 0) {
        pg.send(Tensor::full({2}, 1.0), 1, 1);
        pg.send(Tensor::full({2}, 2.0), 1, 2);
      } else if (r == 1) {
        Tensor a = Tensor::zeros({2}), b = Tensor::zeros({2});
        auto fa = pg.recv_async(a, 0, 1);
        pg.recv(b, 0, 2);
        fa.get();
        log.check(a.at(0) == 1.0 && b.at(1) == 2.0, "tags keep messages apart");
      }
    });
  }
  CHECK(log.checks() == 6 * (2 + 3 + 5) + 3);
  log.report();
}

TEST_CASE("subgroups: new_group and new_subgroups", "[actors]") {
  Log log;
  dopt::simulate(5, [&](dopt::RankContext& ctx) {
    auto& world = ctx.world();
    const int r = ctx.rank();
    auto g = world.new_group({4, 1, 3});
    const bool member = r == 1 || r == 3 || r == 4;
    log.check(g.is_member() == member, "membership");
    log.check(g.size() == 3 && g.ranks() == std::vector<int>{1, 3, 4}, "ranks sorted");
    if (member) {
      log.check(g.rank() == g.group_rank(r) && g.global_rank(g.rank()) == r, "rank mapping");
      Tensor t = Tensor::full({3}, r, DType::int64);
      g.all_reduce(t);
      check_values(log, t, [](std::int64_t) { return 8.0; }, "subgroup all_reduce");
      Tensor b = Tensor::full({3}, r, DType::float32);
      g.broadcast(b, 2);  // group rank 2 = global 4
      check_values(log, b, [](std::int64_t) { return 4.0; }, "subgroup broadcast");
      g.barrier();
    } else {
      bool threw = false;
      try {
        g.barrier();
      } catch (const dopt::StateError&) {
        threw = true;
      }
      log.check(threw, "non-member call throws StateError");
    }
    // world collectives still line up after the subgroup ones
    Tensor w = Tensor::full({2}, 1.0);
    world.all_reduce(w);
    check_values(log, w, [](std::int64_t) { return 5.0; }, "world after subgroup");
  });
  CHECK(log.checks() == 5 * 3 + 3 * 3 + 2);
  log.report();

  Log log2;
  dopt::simulate(4, [&](dopt::RankContext& ctx) {
    auto sub = ctx.world().new_subgroups(2);
    log2.check(sub.all.size() == 2 && sub.current.size() == 2, "two subgroups of two");
    log2.check(sub.current.id() != ctx.world().id() && sub.all[0].id() != sub.all[1].id(), "distinct ids");
    Tensor t = Tensor::full({4}, ctx.rank(), DType::float64);
    sub.current.all_reduce(t);
    const double want = ctx.rank() < 2 ? 1.0 : 5.0;
    check_values(log2, t, [&](std::int64_t) { return want; }, "per-subgroup all_reduce");
    auto whole = ctx.world().new_subgroups();  // default: one group per node
    log2.check(whole.all.size() == 1 && whole.current.size() == 4, "default group size = node");
    bool threw = false;
    try {
      ctx.world().new_subgroups(3);
    } catch (const dopt::ValueError&) {
      threw = true;
    }
    log2.check(threw, "indivisible group size");
  });
  CHECK(log2.checks() == 4 * 5);
  log2.report();
}

namespace {

// Runs fn on world ranks and records each rank's exception (or "ok") as
// "kind: message". Exceptions are rethrown after recording, so that a failing
// rank is reported to its peers like in real use; simulate's own rethrow is
// swallowed here.
std::vector<std::string> outcomes(int world, const std::function<void(dopt::RankContext&)>& fn,
                                  dopt::SimulateOptions opts = {}) {
  std::vector<std::string> out(static_cast<std::size_t>(world), "ok");
  try {
    dopt::simulate(world, [&](dopt::RankContext& ctx) {
      auto& slot = out[static_cast<std::size_t>(ctx.rank())];
      try {
        fn(ctx);
      } catch (const dopt::CollectiveMismatchError& e) {
        slot = std::string("mismatch: ") + e.what();
        throw;
      } catch (const dopt::PeerLostError& e) {
        slot = std::string("lost: ") + e.what();
        throw;
      } catch (const dopt::TimeoutError& e) {
        slot = std::string("timeout: ") + e.what();
        throw;
      } catch (const std::exception& e) {
        slot = std::string("other: ") + e.what();
        throw;
      }
    }, opts);
  } catch (const std::exception&) {
  }
  return out;
}

}  // namespace

TEST_CASE("mismatched collectives raise CollectiveMismatchError on every rank", "[actors]") {
  using Catch::Contains;
  using Catch::StartsWith;
  SECTION("different collective") {
    auto o = outcomes(3, [](dopt::RankContext& ctx) {
      Tensor t = Tensor::zeros({4});
      if (ctx.rank() == 1) ctx.world().broadcast(t, 0);
      else ctx.world().all_reduce(t);
    });
    for (auto& s : o) {
      CHECK_THAT(s, StartsWith("mismatch:") && Contains("rank 0 called all_reduce(sum, float32, [4])") &&
                        Contains("rank 1 called broadcast(src 0, float32, [4])"));
    }
  }
  SECTION("different reduce op") {
    auto o = outcomes(2, [](dopt::RankContext& ctx) {
      Tensor t = Tensor::zeros({4});
      ctx.world().all_reduce(t, ctx.rank() == 1 ? ReduceOp::max : ReduceOp::sum);
    });
    for (auto& s : o) CHECK_THAT(s, StartsWith("mismatch:") && Contains("all_reduce(max"));
  }
  SECTION("different dtype") {
    auto o = outcomes(3, [](dopt::RankContext& ctx) {
      Tensor t = Tensor::zeros({4}, ctx.rank() == 2 ? DType::float64 : DType::float32);
      ctx.world().all_reduce(t);
    });
    for (auto& s : o) CHECK_THAT(s, StartsWith("mismatch:") && Contains("rank 2 called all_reduce(sum, float64, [4])"));
  }
  SECTION("different shape") {
    auto o = outcomes(2, [](dopt::RankContext& ctx) {
      Tensor t = Tensor::zeros({ctx.rank() == 0 ? 4 : 5});
      ctx.world().broadcast(t, 0);
    });
    for (auto& s : o) CHECK_THAT(s, StartsWith("mismatch:") && Contains("[4]") && Contains("[5]"));
  }
  SECTION("different order, and the group works afterwards") {
    auto o = outcomes(2, [](dopt::RankContext& ctx) {
      Tensor t = Tensor::full({4}, 1.0);
      bool mismatched = false;
      try {
        if (ctx.rank() == 0) ctx.world().all_reduce(t);
        else ctx.world().barrier();
      } catch (const dopt::CollectiveMismatchError&) {
        mismatched = true;
      }
      if (!mismatched) throw std::runtime_error("no mismatch");
      ctx.world().all_reduce(t);  // next sequence number: both agree
      if (t.at(0) != 2.0) throw std::runtime_error("wrong value after mismatch");
    });
    for (auto& s : o) CHECK(s == "ok");
  }
  SECTION("send/recv with different shapes") {
    auto o = outcomes(2, [](dopt::RankContext& ctx) {
      if (ctx.rank() == 0) ctx.world().send(Tensor::zeros({3}), 1);
      else ctx.world().recv(Tensor::zeros({4}), 0);
    });
    for (auto& s : o) CHECK_THAT(s, StartsWith("mismatch:") && Contains("[3]") && Contains("[4]"));
  }
}

TEST_CASE("a rank that throws makes its peers fail with PeerLostError, not hang", "[actors]") {
  using Catch::Contains;
  using Catch::StartsWith;
  SECTION("simulate rethrows the failing rank's error, naming it") {
    try {
      dopt::simulate(3, [](dopt::RankContext& ctx) {
        if (ctx.rank() == 1) throw std::runtime_error("boom");
        Tensor t = Tensor::zeros({8});
        ctx.world().all_reduce(t);
      });
      FAIL("simulate did not throw");
    } catch (const dopt::PeerLostError&) {
      FAIL("the root cause must come first, not a PeerLostError");
    } catch (const dopt::Error& e) {
      REQUIRE(e.rank().has_value());
      CHECK(*e.rank() == 1);
      CHECK_THAT(e.what(), Contains("boom"));
    }
    try {
      dopt::simulate(2, [](dopt::RankContext& ctx) {
        if (ctx.rank() == 0) throw dopt::ShapeError("my_op", "bad shape");
        ctx.world().barrier();
      });
      FAIL("simulate did not throw");
    } catch (const dopt::ShapeError& e) {  // type kept, rank added
      CHECK(e.rank() == std::optional<int>(0));
    }
  }
  SECTION("peers waiting in a collective and in recv") {
    auto o = outcomes(4, [](dopt::RankContext& ctx) {
      auto& pg = ctx.world();
      if (ctx.rank() == 1) throw std::runtime_error("boom");
      if (ctx.rank() == 3) {
        pg.recv(Tensor::zeros({2}), 1);
        return;
      }
      Tensor t = Tensor::zeros({8});
      pg.all_reduce(t);
    });
    CHECK_THAT(o[1], StartsWith("other:") && Contains("boom"));
    for (int r : {0, 2, 3}) CHECK_THAT(o[static_cast<std::size_t>(r)], StartsWith("lost:") && Contains("rank 1") && Contains("boom"));
  }
  SECTION("mid-collective: the joined collective completes, the next one fails") {
    auto o = outcomes(3, [](dopt::RankContext& ctx) {
      auto& pg = ctx.world();
      Tensor t = Tensor::full({8}, 1.0);
      auto f = pg.all_reduce_async(t);
      if (ctx.rank() == 2) throw std::runtime_error("boom after joining");
      f.get();
      if (t.at(7) != 3.0) throw std::runtime_error("wrong value");
      pg.barrier();
    });
    CHECK(o[2] == "other: boom after joining");
    for (int r : {0, 1}) CHECK_THAT(o[static_cast<std::size_t>(r)], StartsWith("lost:") && Contains("rank 2"));
  }
  SECTION("a send to a rank that failed") {
    auto o = outcomes(2, [](dopt::RankContext& ctx) {
      if (ctx.rank() == 1) throw std::runtime_error("gone");
      ctx.world().send(Tensor::zeros({2}), 1);
    });
    CHECK_THAT(o[0], StartsWith("lost:") && Contains("rank 1"));
  }
}

TEST_CASE("waits time out with TimeoutError", "[actors]") {
  using Catch::Contains;
  using Catch::StartsWith;
  dopt::SimulateOptions opts;
  opts.timeout = std::chrono::milliseconds(30);
  SECTION("a rank that never joins") {
    auto o = outcomes(3, [](dopt::RankContext& ctx) {
      if (ctx.rank() == 2) return;  // returns without calling: not an error of its own
      Tensor t = Tensor::zeros({8});
      try {
        ctx.world().all_reduce(t);
      } catch (const dopt::TimeoutError& e) {
        // the group is unusable afterwards
        try {
          ctx.world().barrier();
        } catch (const dopt::TimeoutError&) {
          throw e;
        }
        throw std::runtime_error("group still usable after timeout");
      }
    }, opts);
    CHECK(o[2] == "ok");
    for (int r : {0, 1}) CHECK_THAT(o[static_cast<std::size_t>(r)], StartsWith("timeout:") && Contains("2 did not join"));
  }
  SECTION("recv without a sender, timeout set on the group") {
    auto o = outcomes(2, [](dopt::RankContext& ctx) {
      ctx.world().set_timeout(std::chrono::milliseconds(20));
      if (ctx.rank() == 0) ctx.world().recv(Tensor::zeros({2}), 1);
    });
    CHECK_THAT(o[0], StartsWith("timeout:") && Contains("rank 1 did not send"));
    CHECK(o[1] == "ok");
  }
}

TEST_CASE("bad arguments throw before any message", "[actors]") {
  Log log;
  dopt::simulate(2, [&](dopt::RankContext& ctx) {
    auto& pg = ctx.world();
    auto throws = [&](auto&& f, const char* what) {
      bool t = false;
      try {
        f();
      } catch (const dopt::ValueError&) {
        t = true;
      } catch (const dopt::StateError&) {
        t = true;
      }
      log.check(t, what);
    };
    throws([&] { pg.all_reduce(Tensor::zeros({2}, DType::int32), ReduceOp::avg); }, "int avg");
    throws([&] { pg.broadcast(Tensor::zeros({2}), 2); }, "src out of range");
    throws([&] { pg.all_gather({Tensor::zeros({2})}, Tensor::zeros({2})); }, "list size");
    throws([&] { pg.all_gather({Tensor::zeros({2}), Tensor::zeros({3})}, Tensor::zeros({2})); }, "output shape");
    throws([&] { pg.all_gather_into_tensor(Tensor::zeros({3}), Tensor::zeros({2})); }, "flat size");
    throws([&] { pg.all_reduce(Tensor()); }, "undefined");
    throws([&] { pg.send(Tensor::zeros({2}), ctx.rank()); }, "send to self");
    throws([&] { pg.new_group({0, 0}); }, "duplicate rank");
    throws([&] { pg.set_timeout(std::chrono::milliseconds(0)); }, "zero timeout");
    // sequence numbers were not consumed: a collective still lines up
    Tensor t = Tensor::full({2}, 1.0);
    pg.all_reduce(t);
    log.check(t.at(0) == 2.0, "aligned after errors");
  });
  CHECK(log.checks() == 2 * 10);
  log.report();
  CHECK_THROWS_AS(dopt::simulate(0, [](dopt::RankContext&) {}), dopt::ValueError);
}
