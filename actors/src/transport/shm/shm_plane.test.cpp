// The shared-memory plane with simulated ranks: every collective x dtype x
// op at world sizes 1, 2, 3, 5 against a scalar reference, bitwise equality
// with the actor plane and between the plane's three algorithms (small,
// staged, direct), mismatches, timeouts, lost ranks, many calls in flight;
// and the process directory's names for a replaced rank.
#include <catch2/catch.hpp>

#include "rank_checks.hpp"
#include "reductions.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <thread>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/runtime/error.hpp"
#include "transport/shm/directory.hpp"

using namespace dopt;

namespace {

/// Sets an environment variable for the scope of the test (each CTest test
/// runs in its own process).
struct Env {
  std::string name;
  Env(const char* n, const std::string& v) : name(n) { ::setenv(n, v.c_str(), 1); }
  ~Env() { ::unsetenv(name.c_str()); }
};

std::vector<char> bytes_of(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data_ptr());
  return std::vector<char>(p, p + t.nbytes());
}

/// Deterministic values of rank r for call k (exact in every dtype: small
/// integers, halves and quarters, so sums do not depend on rounding except
/// where the test wants them to).
Tensor values(DType dt, std::int64_t n, int r, int k, bool rough = false) {
  std::mt19937 gen(static_cast<unsigned>(1000 * r + k));
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) {
    std::uniform_int_distribution<int> d(-8, 8);
    x = rough ? std::ldexp(static_cast<double>(d(gen)) + 1.0 / (3 + d(gen) % 5 + 5), d(gen) % 4) : d(gen) / 4.0;
    if (!is_floating_point(dt)) x = std::round(x * 4);
    if (dt == DType::uint8) x = std::abs(x);
  }
  return Tensor::from_vector(v).to(dt);
}

/// The reduction of exact inputs, rounded as dopt rounds it: sums and
/// products are exact in double; avg divides in the accumulation type
/// (float for the 16-bit floats).
double reduce_ref(ReduceOp op, const std::vector<double>& xs, DType dt) {
  const int n = static_cast<int>(xs.size());
  const double acc = dopt::testing::reduce_in_rank_order(op, n, [&](int r) { return xs[static_cast<std::size_t>(r)]; });
  return op == ReduceOp::avg ? dopt::testing::avg_in(dt, acc, n) : acc;
}

const std::vector<DType> kDTypes = {DType::float32, DType::float64, DType::float16, DType::bfloat16,
                                    DType::int32,   DType::int64,   DType::int8,    DType::uint8};

/// The ops the tests reduce dt with: avg on floating point only, product
/// not on the 8-bit integers (it would overflow).
std::vector<ReduceOp> ops_for(DType dt) {
  std::vector<ReduceOp> ops;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::product, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    if (op == ReduceOp::avg && !is_floating_point(dt)) continue;
    if (op == ReduceOp::product && (dt == DType::int8 || dt == DType::uint8)) continue;
    ops.push_back(op);
  }
  return ops;
}

/// Runs every collective on the world group and a subgroup; returns, per
/// rank, the bytes of every output in call order.
std::vector<std::vector<std::vector<char>>> run_script(int n, std::int64_t numel, bool rough) {
  std::vector<std::vector<std::vector<char>>> out(static_cast<std::size_t>(n));
  simulate(n, [&](RankContext& ctx) {
    auto& rec = out[static_cast<std::size_t>(ctx.rank())];
    auto& w = ctx.world();
    const int r = ctx.rank();
    int k = 0;
    for (DType dt : kDTypes) {
      for (ReduceOp op : ops_for(dt)) {
        Tensor t = values(dt, numel, r, ++k, rough);
        w.all_reduce(t, op);
        rec.push_back(bytes_of(t));
        Tensor u = values(dt, numel, r, ++k, rough);
        w.reduce(u, (k / 2) % n, op);
        rec.push_back(bytes_of(u));
        std::vector<Tensor> ins;
        for (int g = 0; g < n; ++g) ins.push_back(values(dt, numel, r, 100 * k + g, rough));
        Tensor o = Tensor::zeros({numel}, dt);
        w.reduce_scatter(o, ins, op);
        rec.push_back(bytes_of(o));
      }
      Tensor b = values(dt, numel, r, ++k, rough);
      w.broadcast(b, k % n);
      rec.push_back(bytes_of(b));
      Tensor in = values(dt, numel, r, ++k, rough);
      std::vector<Tensor> outs;
      for (int g = 0; g < n; ++g) outs.push_back(Tensor::zeros({numel}, dt));
      w.all_gather(outs, in);
      for (auto& x : outs) rec.push_back(bytes_of(x));
      Tensor flat = Tensor::zeros({numel * n}, dt);
      w.all_gather_into_tensor(flat, in);
      rec.push_back(bytes_of(flat));
    }
    w.barrier();
    // A subgroup of the even ranks, and the world again afterwards.
    std::vector<int> evens;
    for (int g = 0; g < n; g += 2) evens.push_back(g);
    ProcessGroup sub = w.new_group(evens);
    if (sub.is_member()) {
      Tensor t = values(DType::float32, numel, r, ++k, rough);
      sub.all_reduce(t);
      rec.push_back(bytes_of(t));
    }
    // Coalesced: three tensors as one buffer, ring order and pre-division.
    std::vector<Tensor> parts{values(DType::float32, numel, r, 7001, true), values(DType::float32, 3, r, 7002, true),
                              values(DType::float32, numel / 2 + 1, r, 7003, true)};
    w.all_reduce_coalesced(parts, {ReduceOp::sum, ReduceOrder::ring, n});
    for (auto& x : parts) rec.push_back(bytes_of(x));
    std::vector<Tensor> bparts{values(DType::float64, numel, r, 7004), values(DType::int32, 5, r, 7005)};
    w.broadcast_coalesced(bparts, n - 1);
    for (auto& x : bparts) rec.push_back(bytes_of(x));
  });
  return out;
}

}  // namespace

TEST_CASE("shm plane: every collective, dtype and op against a scalar reference (1, 2, 3, 5 ranks)", "[shm]") {
  for (int n : {1, 2, 3, 5}) {
    for (std::int64_t numel : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}}) {
      CAPTURE(n, numel);
      // Inputs are exact in every dtype, so any order gives the reference.
      dopt::testing::RankLog log;
      simulate(n, [&](RankContext& ctx) {
        auto& w = ctx.world();
        const int r = ctx.rank();
        int k = 0;
        for (DType dt : kDTypes) {
          for (ReduceOp op : ops_for(dt)) {
            if (op == ReduceOp::product && numel > 16) continue;
            ++k;
            Tensor t = values(dt, numel, r, k);
            w.all_reduce(t, op);
            Tensor got = t.to(DType::float64);
            std::vector<Tensor> inputs;
            for (int g = 0; g < n; ++g) inputs.push_back(values(dt, numel, g, k).to(DType::float64));
            for (std::int64_t i = 0; i < numel; ++i) {
              std::vector<double> xs;
              for (int g = 0; g < n; ++g) xs.push_back(inputs[static_cast<std::size_t>(g)].data<double>()[i]);
              double want = Tensor::from_vector(std::vector<double>{reduce_ref(op, xs, dt)}).to(dt).to(DType::float64).data<double>()[0];
              if (got.data<double>()[i] != want) {
                log.fail(r, std::string(dtype_name(dt)) + " " + std::string(reduce_op_name(op)) + " element " +
                                std::to_string(i) + ": " + std::to_string(got.data<double>()[i]) + " != " +
                                std::to_string(want));
                break;
              }
            }
          }
          // broadcast from the last rank, all_gather
          ++k;
          Tensor b = values(dt, numel, r, k);
          w.broadcast(b, n - 1);
          if (bytes_of(b) != bytes_of(values(dt, numel, n - 1, k)))
            log.fail(r, std::string("broadcast ") + std::string(dtype_name(dt)));
          Tensor flat = Tensor::zeros({numel * n}, dt);
          w.all_gather_into_tensor(flat, values(dt, numel, r, ++k));
          for (int g = 0; g < n; ++g)
            if (bytes_of(flat.flat_slice(numel * g, numel)) != bytes_of(values(dt, numel, g, k)))
              log.fail(r, std::string("all_gather ") + std::string(dtype_name(dt)));
        }
      });
      log.report();
    }
  }
}

TEST_CASE("shm plane: bitwise equal to the actor plane, staged and direct paths alike", "[shm]") {
  for (int n : {2, 3, 5}) {
    for (std::int64_t numel : {std::int64_t{5}, std::int64_t{3000}, std::int64_t{40000}}) {
      CAPTURE(n, numel);
      std::vector<std::vector<std::vector<char>>> actor, direct, staged;
      {
        Env e("DOPT_PLANE", "actor");
        actor = run_script(n, numel, true);
      }
      direct = run_script(n, numel, true);
      {
        Env a("DOPT_SHM_STAGED", "1");
        Env b("DOPT_SHM_BUFFER_BYTES", "65536");
        Env c("DOPT_SHM_SMALL_BYTES", "1024");
        staged = run_script(n, numel, true);
      }
      REQUIRE(actor.size() == direct.size());
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        REQUIRE(actor[static_cast<std::size_t>(r)].size() == direct[static_cast<std::size_t>(r)].size());
        REQUIRE(actor[static_cast<std::size_t>(r)].size() == staged[static_cast<std::size_t>(r)].size());
        for (std::size_t i = 0; i < actor[static_cast<std::size_t>(r)].size(); ++i) {
          CAPTURE(i);
          CHECK(actor[static_cast<std::size_t>(r)][i] == direct[static_cast<std::size_t>(r)][i]);
          CHECK(actor[static_cast<std::size_t>(r)][i] == staged[static_cast<std::size_t>(r)][i]);
        }
      }
    }
  }
}

TEST_CASE("shm plane: a mismatch fails every rank alike and the group stays usable", "[shm]") {
  std::atomic<int> mismatches{0};
  simulate(3, [&](RankContext& ctx) {
    auto& w = ctx.world();
    Tensor t = Tensor::full({ctx.rank() == 1 ? 5 : 4}, 1.0);
    try {
      w.all_reduce(t);
    } catch (const CollectiveMismatchError& e) {
      ++mismatches;
      CHECK(std::string(e.what()).find("rank 0 called all_reduce(sum, float32, [4]) but rank 1 called "
                                       "all_reduce(sum, float32, [5])") != std::string::npos);
    }
    Tensor u = Tensor::full({4}, 1.0);
    w.all_reduce(u);
    CHECK(u.data<float>()[0] == 3.0f);
  });
  CHECK(mismatches == 3);
}

TEST_CASE("shm plane: a rank that never joins times out by name, the group is unusable after", "[shm]") {
  std::atomic<int> timeouts{0};
  SimulateOptions so;
  so.timeout = std::chrono::milliseconds(300);
  simulate(3, [&](RankContext& ctx) {
    auto& w = ctx.world();
    if (ctx.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(900));
      // Its peers broke the group meanwhile.
      CHECK_THROWS_AS(w.barrier(), TimeoutError);
      return;
    }
    try {
      w.barrier();
    } catch (const TimeoutError& e) {
      ++timeouts;
      const std::string msg = e.what();
      CHECK((msg.find("rank(s) 2 did not join") != std::string::npos ||
             msg.find("unusable after a timeout") != std::string::npos));
    }
    CHECK_THROWS_AS(w.barrier(), TimeoutError);
  }, so);
  CHECK(timeouts == 2);
}

TEST_CASE("shm plane: a rank that fails before joining is named by the others' PeerLostError", "[shm]") {
  std::atomic<int> lost{0};
  CHECK_THROWS_WITH(simulate(3, [&](RankContext& ctx) {
    if (ctx.rank() == 1) throw ValueError("user", "boom");
    try {
      Tensor t = Tensor::full({100000}, 1.0);
      ctx.world().all_reduce(t);
    } catch (const PeerLostError& e) {
      ++lost;
      CHECK(std::string(e.what()).find("rank 1 was lost before it joined") != std::string::npos);
      throw;
    }
  }), Catch::Contains("boom"));
  CHECK(lost == 2);
}

TEST_CASE("shm plane: a failed rank's calls already submitted still complete", "[shm]") {
  std::atomic<bool> done{false};
  CHECK_THROWS_WITH(simulate(2, [&](RankContext& ctx) {
    auto& w = ctx.world();
    Tensor t = Tensor::full({1000}, 1.0);
    if (ctx.rank() == 0) {
      auto f = w.all_reduce_async(t);
      (void)f;
      throw ValueError("user", "rank 0 gives up after submitting");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    w.all_reduce(t);  // rank 0's executor still runs its submitted call
    CHECK(t.data<float>()[0] == 2.0f);
    done = true;
  }), Catch::Contains("gives up"));
  CHECK(done);
}

TEST_CASE("shm plane: many async calls in flight, completed in order, mixed with blocking ones", "[shm]") {
  simulate(3, [&](RankContext& ctx) {
    auto& w = ctx.world();
    std::vector<Tensor> ts;
    std::vector<Future<void>> fs;
    for (int i = 0; i < 200; ++i) {
      ts.push_back(Tensor::full({i % 7 == 0 ? 20000 : 16}, static_cast<double>(i)));
      fs.push_back(w.all_reduce_async(ts.back()));
      if (i % 50 == 0) {
        Tensor b = Tensor::full({4}, 1.0);
        w.all_reduce(b);  // queued behind the async ones
        CHECK(b.data<float>()[0] == 3.0f);
      }
    }
    for (int i = 0; i < 200; ++i) {
      fs[static_cast<std::size_t>(i)].get();
      CHECK(ts[static_cast<std::size_t>(i)].data<float>()[0] == 3.0f * static_cast<float>(i));
    }
  });
}

TEST_CASE("shm plane: 5 ranks on 2 cores make progress (spin, then sleep)", "[shm]") {
  simulate(5, [&](RankContext& ctx) {
    for (int i = 0; i < 300; ++i) {
      Tensor t = Tensor::full({i % 3 == 0 ? 50000 : 8}, 1.0);
      ctx.world().all_reduce(t);
      REQUIRE(t.data<float>()[0] == 5.0f);
    }
  });
}

namespace {

/// What each survivor's call ended with (checked on the test's thread).
struct Outcomes {
  std::mutex mutex;
  std::map<int, std::string> got;  // global rank -> "lost: <what>", "timeout: <what>", ...
  std::atomic<int> ended{0};
  void put(int r, std::string s) {
    std::lock_guard<std::mutex> lock(mutex);
    got[r] = std::move(s);
  }
};

void run_op(ProcessGroup& g, const std::string& op) {
  if (op == "barrier") {
    g.barrier();
  } else {
    Tensor t = Tensor::full({100000}, 1.0);
    g.all_reduce(t);
  }
}

/// On group g (members: global ranks), the last member is lost before it
/// joins op and the first one stays out of op until every other survivor's
/// call ended: those wait on a survivor, not on the lost rank, and must
/// still fail with PeerLostError (the first member's call after them too).
void lose_last(ProcessGroup& g, const std::vector<int>& members, int me, const std::string& op, Outcomes& out) {
  const int late = members.front(), lost = members.back();
  const int middle = static_cast<int>(members.size()) - 2;
  if (me == lost) throw ValueError("user", "boom: rank " + std::to_string(me) + " is lost");
  if (me == late)  // bounded: the group timeout (10 s) ends the others' waits in any case
    for (int i = 0; i < 2000 && out.ended.load() < middle; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  try {
    run_op(g, op);
    out.put(me, "completed");
  } catch (const PeerLostError& e) {
    out.put(me, std::string("lost: ") + e.what());
  } catch (const Error& e) {
    out.put(me, std::string("other: ") + e.what());
  }
  if (me != late) ++out.ended;
}

void check_named(Outcomes& out, const std::vector<int>& survivors, int lost) {
  std::lock_guard<std::mutex> lock(out.mutex);
  for (int r : survivors) {
    INFO("rank " << r);
    REQUIRE(out.got.count(r) == 1);
    const std::string& s = out.got[r];
    INFO(s);
    CHECK(s.rfind("lost: ", 0) == 0);
    CHECK(s.find("rank " + std::to_string(lost) + " was lost") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("shm plane: a rank lost in a subgroup's call fails every survivor's wait, also those on a survivor",
          "[shm]") {
  const int n = GENERATE(3, 5);
  const std::string op = GENERATE(std::string("barrier"), std::string("all_reduce"));
  INFO(n << " ranks, " << op);
  std::vector<int> members;  // 5 ranks: without rank 1; 3 ranks: all of them (a new group)
  for (int r = 0; r < n; ++r)
    if (n < 5 || r != 1) members.push_back(r);
  Outcomes out;
  SimulateOptions so;
  so.timeout = std::chrono::seconds(10);
  CHECK_THROWS_WITH(simulate(n, [&](RankContext& ctx) {
    ProcessGroup sub = ctx.world().new_group(members);
    if (!sub.is_member()) return;
    REQUIRE(sub.plane_stats().plane == "shm");
    lose_last(sub, members, ctx.rank(), op, out);
  }, so), Catch::Contains("boom"));
  check_named(out, std::vector<int>(members.begin(), members.end() - 1), members.back());
}

TEST_CASE("shm plane: a rank lost in a shrunk group's call fails every survivor's wait, also those on a survivor",
          "[shm][shrink]") {
  const int n = GENERATE(3, 5);
  const std::string op = GENERATE(std::string("barrier"), std::string("all_reduce"));
  INFO(n << " ranks, " << op);
  std::vector<int> members;  // the survivors of rank 1's loss
  for (int r = 0; r < n; ++r)
    if (r != 1) members.push_back(r);
  Outcomes out;
  SimulateOptions so;
  so.timeout = std::chrono::seconds(10);
  CHECK_THROWS_WITH(simulate(n, [&](RankContext& ctx) {
    auto& w = ctx.world();
    if (ctx.rank() == 1) throw ValueError("user", "boom: rank 1 is lost");
    CHECK_THROWS_AS(w.barrier(), PeerLostError);
    ProcessGroup g = w.shrink().group;
    REQUIRE(g.size() == n - 1);
    REQUIRE(g.plane_stats().plane == "shm");
    lose_last(g, members, ctx.rank(), op, out);
  }, so), Catch::Contains("boom"));
  check_named(out, std::vector<int>(members.begin(), members.end() - 1), members.back());
}

TEST_CASE("shm plane: a replaced rank's regions are found under its new process's name", "[shm][grow]") {
  // Two ranks' directories in this process: rank 0 a member (its process:
  // this test's parent, alive throughout, so nobody takes its names for a
  // dead process's), rank 1 lost (a process id nobody creates under) and
  // replaced by this process. The member finds the replacement's region only
  // once it has renewed the slot (grow() between processes does so).
  using detail::shm_plane::ShmDirectory;
  const int parent = static_cast<int>(::getppid());
  const int me = static_cast<int>(::getpid());
  const std::string job = "renew" + std::to_string(me);
  ShmDirectory member({parent, 0}, job);
  ShmDirectory replacement({parent, me}, job);
  const std::uint64_t gid = 77;
  const std::size_t bytes = 1u << 16;
  auto mine = replacement.create(gid, 1, bytes, bytes);
  static_cast<char*>(mine.base)[bytes - 1] = 42;
  CHECK(member.name(gid, 1) != replacement.name(gid, 1));
  CHECK_THROWS_AS(member.open(gid, 1, bytes), IOError);  // the lost process's name: nothing there
  member.renew_process(1, me);
  CHECK(member.name(gid, 1) == replacement.name(gid, 1));
  CHECK(member.name(gid, 0) == replacement.name(gid, 0));  // the other ranks' names stay
  auto seen = member.open(gid, 1, bytes);
  CHECK(static_cast<const char*>(seen.base)[bytes - 1] == 42);
  replacement.seal(gid, 1);
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + replacement.name(gid, 1)));
}
