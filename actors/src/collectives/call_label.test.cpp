// Errors of collectives name the user's calls first (call_label.hpp): the
// public call on each rank, grouped by call, then the internal operations;
// a timeout names the call it happened in. On the shm and the actor plane,
// with 3 and 5 simulated ranks.
#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "dopt/actors/internal/call_label.hpp"
#include "call_names.hpp"
#include "dopt/actors/simulate.hpp"

using namespace dopt;
using Catch::Contains;
using Catch::StartsWith;
using dopt::testing::on_ranks_but;

namespace {

struct Outcome {
  std::string op;    // Error::op()
  std::string what;  // "kind: what()"
};

/// Runs fn on `world` ranks of `plane`; each rank's first dopt::Error (or
/// "ok"). A rank that failed returns normally, so its peers are not lost.
std::vector<Outcome> run(int world, const std::string& plane, const std::function<void(RankContext&)>& fn,
                         SimulateOptions opts = {}) {
  std::vector<Outcome> out(static_cast<std::size_t>(world), Outcome{"", "ok"});
  opts.plane = plane;
  simulate(world, [&](RankContext& ctx) {
    auto& slot = out[static_cast<std::size_t>(ctx.rank())];
    try {
      fn(ctx);
    } catch (const CollectiveMismatchError& e) {
      slot = {e.op(), std::string("mismatch: ") + e.what()};
    } catch (const TimeoutError& e) {
      slot = {e.op(), std::string("timeout: ") + e.what()};
    } catch (const Error& e) {
      slot = {e.op(), std::string("other: ") + e.what()};
    }
  }, opts);
  return out;
}

}  // namespace

TEST_CASE("call labels: the users' calls grouped by rank, each call once, in the order of its lowest rank",
          "[actors][call_label]") {
  CHECK(detail::calls_by_rank({{0, "A::step()"}, {1, "B::step()"}, {2, "A::step()"}}) ==
        "A::step() on ranks 0, 2; B::step() on rank 1");
  CHECK(detail::calls_by_rank({{0, "A::step()"}}) == "A::step() on rank 0");
  CHECK(detail::calls_by_rank({{3, ""}, {4, "f()"}}) == "an unnamed call on rank 3; f() on rank 4");
  CHECK(detail::mismatch_text({{0, "f()"}, {1, "g()"}}, "x vs y") ==
        "f() on rank 0; g() on rank 1; internally: x vs y");
}

TEST_CASE("call labels: the outermost scope names the call, and only while it is open", "[actors][call_label]") {
  CHECK(detail::current_call() == nullptr);
  {
    detail::CallScope outer("Outer::step()");
    {
      detail::CallScope inner("Inner::run()");
      CHECK(std::string(detail::current_call()) == "Outer::step()");
    }
    CHECK(std::string(detail::current_call()) == "Outer::step()");
  }
  CHECK(detail::current_call() == nullptr);
}

TEST_CASE("a mismatch of direct ProcessGroup calls names the ProcessGroup methods on each rank, then the collectives",
          "[actors][call_label]") {
  const int n = GENERATE(3, 5);
  const std::string plane = GENERATE("shm", "actor");
  CAPTURE(n, plane);
  auto o = run(n, plane, [](RankContext& ctx) {
    Tensor t = Tensor::zeros({4});
    if (ctx.rank() == 1) ctx.world().broadcast(t, 0);
    else ctx.world().all_reduce(t);
  });
  const std::string calls =
      "ProcessGroup::all_reduce() " + on_ranks_but(n, 1) + "; ProcessGroup::broadcast() on rank 1";
  for (int r = 0; r < n; ++r) {
    const auto& s = o[static_cast<std::size_t>(r)];
    CHECK(s.op == (r == 1 ? "ProcessGroup::broadcast()" : "ProcessGroup::all_reduce()"));
    CHECK_THAT(s.what, StartsWith("mismatch: " + s.op + " [rank " + std::to_string(r) + "]: " + calls +
                                  "; internally: collective mismatch in world group at seq 0: rank 0 called "
                                  "all_reduce(sum, float32, [4]) but rank 1 called broadcast(src 0, float32, [4])"));
  }
}

TEST_CASE("a mismatch names the public calls that issued the collectives, sync or async, the label is not compared",
          "[actors][call_label]") {
  const int n = GENERATE(3, 5);
  const std::string plane = GENERATE("shm", "actor");
  CAPTURE(n, plane);
  auto o = run(n, plane, [](RankContext& ctx) {
    // The same collective from two different public calls: it runs.
    {
      detail::CallScope s(ctx.rank() == 2 ? "Other::sync()" : "Trainer::sync()");
      Tensor u = Tensor::full({2}, 1.0);
      ctx.world().all_reduce(u);
      if (u.at(0) != ctx.world_size()) throw StateError("test", "wrong sum");
    }
    Tensor t = Tensor::zeros({ctx.rank() == 2 ? 5 : 4});
    if (ctx.rank() == 2) {
      detail::CallScope s("Evaluator::run()");
      ctx.world().all_reduce(t);
    } else {
      detail::CallScope s("Trainer::step()");
      Future<void> f;
      {
        detail::CallScope inner("Reducer::finalize()");  // inside the step: the step names it
        f = ctx.world().all_reduce_async(t);
      }
      f.get();
    }
  });
  const std::string calls = "Trainer::step() " + on_ranks_but(n, 2) + "; Evaluator::run() on rank 2";
  for (int r = 0; r < n; ++r) {
    const auto& s = o[static_cast<std::size_t>(r)];
    CHECK(s.op == (r == 2 ? "Evaluator::run()" : "Trainer::step()"));
    CHECK_THAT(s.what, StartsWith("mismatch: ") && Contains("]: " + calls + "; internally: ") &&
                           Contains("rank 0 called all_reduce(sum, float32, [4]) but rank 2 called "
                                    "all_reduce(sum, float32, [5])"));
  }
}

TEST_CASE("a collective's timeout names the user's call, the collective second", "[actors][call_label]") {
  const int n = GENERATE(3, 5);
  const std::string plane = GENERATE("shm", "actor");
  CAPTURE(n, plane);
  SimulateOptions opts;
  opts.timeout = std::chrono::milliseconds(200);
  std::atomic<int> waited{0};
  if (plane == "shm") {  // virtual time: rank 1 stops at its first call, it never joins
    opts.deterministic = true;
    opts.seed = 7;
    opts.faults.stop(1, 1);
  }
  auto o = run(n, plane, [&](RankContext& ctx) {
    if (ctx.rank() == 1 && plane == "actor") {  // never joins; stays until the others timed out
      while (waited.load() < ctx.world_size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    detail::CallScope s("Trainer::step()");
    Tensor t = Tensor::zeros({4});
    try {
      ctx.world().all_reduce(t);
    } catch (...) {
      ++waited;
      throw;
    }
  }, opts);
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    const auto& s = o[static_cast<std::size_t>(r)];
    CHECK(s.op == "Trainer::step()");
    CHECK_THAT(s.what, StartsWith("timeout: Trainer::step() [rank " + std::to_string(r) + "]: ") &&
                           Contains("all_reduce(sum, float32, [4])") && Contains("1 did not join"));
  }
}
