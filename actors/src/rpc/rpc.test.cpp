// dopt::rpc between simulated workers (one process): calls, errors,
// deadlines, idempotency, RRefs and their lifetime, gradient contexts,
// graceful shutdown. No sleeps: workers that only serve return from their fn
// at once and serve from shutdown() until worker 0 (the driver) is done.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "dopt/actors/internal/served_mutex.hpp"
#include "dopt/actors/rpc.hpp"
#include "dopt/actors/simulate.hpp"
#include "live_count.hpp"
#include "rpc/testing.hpp"

using namespace dopt;
using namespace dopt::rpc;
using Catch::Matchers::Contains;

namespace {

std::string kind_of_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return error_kind(err) + ": " + err.what();
  } catch (const std::exception& ex) {
    return std::string("std: ") + ex.what();
  }
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (...) {
    return kind_of_error(std::current_exception());
  }
  return "no error";
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// A value that counts its live instances.
struct Tracked : dopt::testing::LiveCounted<Tracked> {
  using LiveCounted::LiveCounted;
};
void dopt_encode(Encoder& e, const Tracked& t) { write(e, t.value); }
void dopt_decode(Decoder& d, Tracked& t) { read(d, t.value); }

struct Counter {
  long n = 0;
};

std::atomic<int> g_count_once{0};
std::mutex g_gate_mutex;
// dopt's promise, not std::promise: the deterministic scheduler sees its waits.
std::optional<Promise<void>> g_gate;
Future<void> g_gate_future;
std::mutex g_kept_mutex;
std::optional<RRef<Tracked>> g_kept;
std::optional<GradContext> g_dead_ctx;

void register_test_functions() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_function("t.add", [](Tensor a, double b) {
      Tensor out = a.clone();
      for (std::int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] += static_cast<float>(b);
      return out;
    });
    register_function("t.concat", [](const std::string& a, std::vector<int> b, std::optional<int> c) {
      std::string s = a;
      for (int x : b) s += std::to_string(x);
      return std::make_pair(s, c.value_or(-1));
    });
    register_function("t.whoami", [](Agent& a) { return a.name(); });
    register_function("t.throw_shape", [](int n) -> int { throw ShapeError("t.throw_shape", "bad shape " + std::to_string(n)); });
    register_function("t.throw_std", []() -> int { throw std::runtime_error("plain failure"); });
    register_function("t.count_once", [] { return ++g_count_once; });
    register_function("t.read_count", [] { return g_count_once.load(); });
    register_function("t.wait_gate", [] {
      Future<void> f;
      {
        std::lock_guard<std::mutex> lock(g_gate_mutex);
        f = g_gate_future;
      }
      f.wait();
      return 1;
    });
    register_function("t.count_then_wait_gate", [] {
      ++g_count_once;
      Future<void> f;
      {
        std::lock_guard<std::mutex> lock(g_gate_mutex);
        f = g_gate_future;
      }
      f.wait();
      return 1;
    });
    register_function("t.open_gate", [] {
      std::lock_guard<std::mutex> lock(g_gate_mutex);
      g_gate->set_value();
    });
    register_function("t.die", [](Agent& a) { rpc::testing::kill(a); });
    register_function("t.make_tracked", [](int v) { return Tracked(v); });
    register_function("t.make_counter", [] { return Counter{}; });
    register_function("t.local_value_of", [](RRef<Tracked> r) { return r.local_value().value; });
    register_method<Counter>("t.bump", [](Counter& c, int by) {
      // read-modify-write with room for a lost update if two ran at once
      volatile long n = c.n;
      for (int i = 0; i < 100; ++i) n = n + 0;
      c.n = n + by;
    });
    register_method<Counter>("t.get", [](Counter& c) { return c.n; });
    register_method<Tracked>("t.tracked_value", [](Agent& a, Tracked& t) { return t.value + 1000 * a.rank(); });
    register_function("t.keep", [](RRef<Tracked> r) {
      std::lock_guard<std::mutex> lock(g_kept_mutex);
      g_kept = std::move(r);
    });
    register_function("t.kept_is_owner", [] {
      std::lock_guard<std::mutex> lock(g_kept_mutex);
      return g_kept->is_owner();
    });
    register_function("t.drop_kept_then_count", [](Agent& a, int owner) {
      {
        std::lock_guard<std::mutex> lock(g_kept_mutex);
        g_kept.reset();
      }
      return a.rpc_sync<std::int64_t>(owner, "t.owned");
    });
    register_function("t.wait_lost_then_owned", [](Agent& a, int rank) {
      if (!a.wait_until_lost(rank, std::chrono::seconds(30))) throw TimeoutError("test", "never saw it die");
      return static_cast<std::int64_t>(rpc::testing::num_owned(a));
    });
    register_function("t.owned", [](Agent& a) { return static_cast<std::int64_t>(rpc::testing::num_owned(a)); });
    // On the owner: has its caller killed, sees it lost, then returns an RRef to a new value to it.
    register_function("t.make_for_lost_caller", [](Agent& a, int caller) {
      (void)a.rpc_async(caller, "t.die");
      if (!a.wait_until_lost(caller, std::chrono::seconds(30))) throw TimeoutError("test", "never saw it die");
      return a.make_rref(Tracked(13));
    });
    register_function("t.ask_make_for_me", [](Agent& a, int owner) {
      (void)a.rpc_sync<RRef<Tracked>>(owner, "t.make_for_lost_caller", a.rank());
    });
    register_function("t.contexts", [](Agent& a) { return static_cast<std::int64_t>(rpc::testing::num_contexts(a)); });
    register_function("t.make_param", [](int n) { return Tensor::full({n}, 0.5); });
    register_function("t.ctx_grad", [](Agent& a, std::uint64_t ctx, RRef<Tensor> p) {
      return a.context_grad(ctx, p.id());
    });
    register_function("t.deposit_then_die", [](Agent& a, RRef<Tensor> p) {
      g_dead_ctx = a.new_context();
      g_dead_ctx->deposit(p, Tensor::full({4}, 1.0)).get();
      rpc::testing::kill(a);
    });
    register_function("t.wait_lost_then_contexts", [](Agent& a, int rank) {
      if (!a.wait_until_lost(rank, std::chrono::seconds(30))) throw TimeoutError("test", "never saw it die");
      return static_cast<std::int64_t>(rpc::testing::num_contexts(a));
    });
    register_function("t.nested", [](Agent& a, int to, int depth) -> int {
      if (depth == 0) return a.rank();
      return a.rpc_sync<int>((a.rank() + 1) % a.world_size(), "t.nested", to, depth - 1) + 1;
    });
  });
}

}  // namespace

// Catch2 2.x assertions are not thread-safe: worker threads assert under one lock.
// Served: the checked expression may make RPC calls (a scheduling point of
// the deterministic scheduler) while the lock is held.
dopt::rpc::detail::ServedMutex g_catch_mutex;
using CatchLock = std::lock_guard<dopt::rpc::detail::ServedMutex>;
#define SCHECK(...) do { CatchLock l_(g_catch_mutex); CHECK(__VA_ARGS__); } while (0)
#define SCHECK_FALSE(...) do { CatchLock l_(g_catch_mutex); CHECK_FALSE(__VA_ARGS__); } while (0)
#define SCHECK_THAT(a, m) do { CatchLock l_(g_catch_mutex); CHECK_THAT(a, m); } while (0)
#define SCHECK_THROWS_AS(e, T) do { CatchLock l_(g_catch_mutex); CHECK_THROWS_AS(e, T); } while (0)


TEST_CASE("rpc serialisation round-trips values and rejects mismatches", "[rpc]") {
  auto v = std::make_tuple(std::string("x"), std::vector<double>{1.5, -2}, std::optional<int>(), true,
                           std::pair<int, float>{3, 0.1f});
  auto back = from_bytes<decltype(v)>(to_bytes(v));
  SCHECK(back == v);
  Tensor t = Tensor::from_vector(std::vector<float>{1.f, -0.f, 3.25f}, {3, 1});
  Tensor u = from_bytes<Tensor>(to_bytes(t));
  SCHECK(same_bits(t, u));
  SCHECK_FALSE(u.is_same(t));
  SCHECK_FALSE(from_bytes<Tensor>(to_bytes(Tensor())).defined());
  SCHECK(from_bytes<double>(to_bytes(7)) == 7.0);  // int into double
  SCHECK_THROWS_AS(from_bytes<int>(to_bytes(1.5)), TypeError);
  SCHECK_THROWS_AS(from_bytes<std::uint8_t>(to_bytes(300)), TypeError);
  SCHECK_THROWS_AS(from_bytes<std::string>(to_bytes(3)), TypeError);
  SCHECK_THROWS_AS(from_bytes<Tensor>(std::vector<char>{'T', 1}), TypeError);
  // Error messages name types readably; an unknown string stays as it is.
  SCHECK(dopt::rpc::detail::readable_type_name(typeid(std::vector<float>).name()) ==
         "std::vector<float, std::allocator<float> >");
  SCHECK(dopt::rpc::detail::readable_type_name(typeid(Tracked).name()) == "(anonymous namespace)::Tracked");
  SCHECK(dopt::rpc::detail::readable_type_name("no such type!") == "no such type!");
  Tracked tr(5);
  SCHECK(from_bytes<Tracked>(to_bytes(tr)).value == 5);
  static_assert(encodable<std::vector<std::pair<std::uint64_t, Tensor>>>());
  static_assert(!encodable<Counter>());
}

TEST_CASE("rpc calls between 3 and 5 simulated workers", "[rpc]") {
  register_test_functions();
  const int n = GENERATE(3, 5);
  std::atomic<int> checks{0};
  simulate(n, [&](Agent& a) {
    std::vector<Future<Tensor>> fs;
    const Tensor x = Tensor::full({5}, a.rank());
    for (int r = 0; r < n; ++r) fs.push_back(a.rpc_async<Tensor>(r, "t.add", x, 0.25 * r));
    for (int r = 0; r < n; ++r) {
      Tensor want = Tensor::full({5}, a.rank() + 0.25 * r);
      SCHECK(same_bits(fs[static_cast<std::size_t>(r)].get(), want));
      ++checks;
    }
    // by name, strings/vectors/optionals/pairs, Agent& parameter
    const std::string peer = "worker" + std::to_string((a.rank() + 1) % n);
    auto [s, c] = a.rpc_sync<std::pair<std::string, int>>(peer, "t.concat", "ab", std::vector<int>{1, 2}, 7);
    SCHECK(s == "ab12");
    SCHECK(c == 7);
    SCHECK(a.rpc_sync<std::string>(peer, "t.whoami") == peer);
    // nested calls from inside functions (pool threads may block)
    SCHECK(a.rpc_sync<int>(a.rank(), "t.nested", 0, n) == n + a.rank());
    checks += 3;
  });
  SCHECK(checks == n * (n + 3));
}

TEST_CASE("rpc errors: unknown function, bad arguments, remote exceptions keep their type", "[rpc]") {
  register_test_functions();
  simulate(3, [](Agent& a) {
    if (a.rank() != 0) return;
    std::string e = error_of([&] { a.rpc_sync<int>("worker2", "t.no_such_function", 1); });
    SCHECK_THAT(e, Contains("KeyError") && Contains("t.no_such_function") && Contains("worker2"));
    e = error_of([&] { a.rpc_sync<int>("worker1", "t.add", 1, 2.0); });
    SCHECK_THAT(e, Contains("TypeError") && Contains("t.add"));
    e = error_of([&] { a.rpc_sync<int>("worker1", "t.add", Tensor::zeros({1})); });
    SCHECK_THAT(e, Contains("TypeError") && Contains("2 argument(s)"));
    e = error_of([&] { a.rpc_sync<int>("worker1", "t.throw_shape", 4); });
    SCHECK_THAT(e, Contains("ShapeError") && Contains("bad shape 4") && Contains("worker1"));
    e = error_of([&] { a.rpc_sync<int>("worker1", "t.throw_std"); });
    SCHECK_THAT(e, Contains("Error") && Contains("plain failure"));
    e = error_of([&] { a.rpc_sync<int>("nobody", "t.whoami"); });
    SCHECK_THAT(e, Contains("KeyError") && Contains("nobody"));
    e = error_of([&] { a.rpc_sync<int>(7, "t.whoami"); });
    SCHECK_THAT(e, Contains("ValueError"));
    // a result read as the wrong type
    e = error_of([&] { a.rpc_sync<int>("worker1", "t.whoami"); });
    SCHECK_THAT(e, Contains("TypeError"));
  });
}

TEST_CASE("rpc deadlines: a call without a reply in time fails with TimeoutError naming function and workers",
          "[rpc]") {
  register_test_functions();
  {
    std::lock_guard<std::mutex> lock(g_gate_mutex);
    g_gate.emplace();
    g_gate_future = g_gate->get_future();
  }
  simulate(3, [](Agent& a) {
    if (a.rank() != 1) return;
    auto f = a.rpc_async<int>("worker2", Fn("t.wait_gate", {.timeout = std::chrono::milliseconds(100)}));
    std::string e = error_of([&] { f.get(); });
    SCHECK_THAT(e, Contains("TimeoutError") && Contains("t.wait_gate") && Contains("worker2") &&
                      Contains("worker1") && Contains("100 ms"));
    a.rpc_sync("worker2", "t.open_gate");
    // the late reply is dropped; the agent keeps working
    SCHECK(a.rpc_sync<std::string>("worker2", "t.whoami") == "worker2");
  });
}

TEST_CASE("rpc idempotency: a request sent three times with one call id runs once", "[rpc]") {
  register_test_functions();
  g_count_once = 0;
  simulate(3, [](Agent& a) {
    if (a.rank() != 0) return;
    SCHECK(rpc::testing::rpc_sync_duplicated<int>(a, "worker1", "t.count_once", 3) == 1);
    // the repeats reached worker1 before this call; none ran
    SCHECK(a.rpc_sync<int>("worker1", "t.read_count") == 1);
    SCHECK(rpc::testing::rpc_sync_duplicated<int>(a, "worker2", "t.count_once", 5) == 2);
    SCHECK(a.rpc_sync<int>("worker2", "t.read_count") == 2);
  });
  SCHECK(g_count_once == 2);
}

TEST_CASE("rpc retries: a call resent after its deadline runs once on the callee", "[rpc]") {
  register_test_functions();
  g_count_once = 0;
  {
    std::lock_guard<std::mutex> lock(g_gate_mutex);
    g_gate.emplace();
    g_gate_future = g_gate->get_future();
  }
  simulate(3, [](Agent& a) {
    if (a.rank() != 0) return;
    auto fn = Fn("t.count_then_wait_gate", {.timeout = std::chrono::milliseconds(50), .retries = 3});
    std::string e = error_of([&] { a.rpc_sync<int>("worker2", fn); });
    SCHECK_THAT(e, Contains("TimeoutError") && Contains("4 attempts"));
    a.rpc_sync("worker1", "t.open_gate");
    // all four requests reached worker2 before this call: it ran once
    SCHECK(a.rpc_sync<int>("worker2", "t.read_count") == 1);
    // a call that finishes is answered from the first attempt's reply
    SCHECK(a.rpc_sync<int>("worker2", Fn("t.count_once", {.retries = 2})) == 2);
  });
  CHECK(g_count_once == 2);
}

TEST_CASE("rpc dead worker: pending and later calls fail with PeerLostError naming it", "[rpc]") {
  register_test_functions();
  const int n = GENERATE(3, 5);
  simulate(n, [n](Agent& a) {
    if (a.rank() != 0) return;
    const int victim = n - 1;
    std::string e = error_of([&] { a.rpc_sync(victim, "t.die"); });
    SCHECK_THAT(e, Contains("PeerLostError") && Contains("worker" + std::to_string(victim)) &&
                      Contains("rank " + std::to_string(victim)) && Contains("t.die"));
    e = error_of([&] { a.rpc_sync<std::string>(victim, "t.whoami"); });
    SCHECK_THAT(e, Contains("PeerLostError") && Contains("worker" + std::to_string(victim)));
    SCHECK(a.rpc_sync<std::string>(1, "t.whoami") == "worker1");
  });
}

TEST_CASE("rpc RRefs: remote values, to_here, methods in the owner's strand, local_value", "[rpc]") {
  register_test_functions();
  const int n = GENERATE(3, 5);
  std::mutex m;
  std::optional<RRef<Counter>> shared;
  Promise<void> made;
  auto made_f = made.get_future();
  std::atomic<int> done_bumping{0};
  simulate(n, [&](Agent& a) {
    if (a.rank() == 0) {
      RRef<Tracked> t = a.remote<Tracked>("worker1", "t.make_tracked", 42);
      SCHECK(t.owner().name == "worker1");
      SCHECK_FALSE(t.is_owner());
      SCHECK(t.to_here().value == 42);
      SCHECK(t.rpc_sync<int>("t.tracked_value") == 1042);
      SCHECK_THROWS_AS(t.local_value(), StateError);
      SCHECK_THAT(error_of([&] { t.local_value(); }),
                  Contains("owned by worker 'worker1' (rank 1), not by worker 'worker0' (rank 0)"));
      auto mine = a.make_rref(Tracked(9));
      SCHECK(mine.is_owner());
      SCHECK(mine.local_value().value == 9);
      SCHECK(mine.to_here().value == 9);
      // a method of another type
      SCHECK_THAT(error_of([&] { t.rpc_sync<long>("t.get"); }), Contains("TypeError") && Contains("t.get"));
      // ... naming both types readably (demangled), not as typeid's mangled names
      SCHECK_THAT(error_of([&] { t.rpc_sync<long>("t.get"); }),
                  Contains("is for values of type (anonymous namespace)::Counter, the RRef holds "
                           "(anonymous namespace)::Tracked"));
      // a remote() whose function fails: the RRef's uses fail
      auto bad = a.remote<Tracked>("worker2", "t.no_such_function", 1);
      SCHECK_THAT(error_of([&] { bad.to_here(); }), Contains("KeyError") && Contains("t.no_such_function"));
      auto counter = a.remote<Counter>("worker2", "t.make_counter");  // a call: not under the lock
      {
        std::lock_guard<std::mutex> lock(m);
        shared = std::move(counter);
      }
      made.set_value();
    }
    made_f.wait();
    RRef<Counter> c;
    {
      std::lock_guard<std::mutex> lock(m);
      c = *shared;
    }
    std::vector<Future<void>> fs;
    for (int i = 0; i < 100; ++i) fs.push_back(c.rpc_async("t.bump", 1));
    for (auto& f : fs) f.get();
    if (++done_bumping == n) {
      SCHECK(c.rpc_sync<long>("t.get") == 100L * n);  // no lost update
      // Every rank copied `shared` before it bumped, so it can go now (not
      // earlier: a rank still to copy it would read a destroyed RRef).
      std::lock_guard<std::mutex> lock(m);
      shared.reset();
    }
    c = RRef<Counter>();
  });
}

TEST_CASE("rpc RRef lifetime: the owner frees the value when the last holder lets go or dies", "[rpc]") {
  register_test_functions();
  Tracked::live = 0;
  simulate(3, [](Agent& a) {
    if (a.rank() != 0) return;
    RRef<Tracked> r = a.remote<Tracked>("worker2", "t.make_tracked", 7);
    SCHECK(r.to_here().value == 7);
    SCHECK(a.rpc_sync<std::int64_t>("worker2", "t.owned") == 1);
    SCHECK(Tracked::live == 1);
    a.rpc_sync("worker1", "t.keep", r);  // worker1 holds it too
    SCHECK_FALSE(a.rpc_sync<bool>("worker1", "t.kept_is_owner"));
    r = RRef<Tracked>();  // worker0 lets go; worker1 still holds it
    SCHECK(a.rpc_sync<std::int64_t>("worker2", "t.owned") == 1);
    SCHECK(Tracked::live == 1);
    // worker1 lets go (and asks the owner after its release)
    SCHECK(a.rpc_sync<std::int64_t>("worker1", "t.drop_kept_then_count", 2) == 0);
    SCHECK(Tracked::live == 0);
    // a value owned here, held by another worker, then by nobody
    auto mine = a.make_rref(Tracked(3));
    a.rpc_sync("worker1", "t.keep", mine);
    mine = RRef<Tracked>();
    SCHECK(rpc::testing::num_owned(a) == 1);
    SCHECK(a.rpc_sync<std::int64_t>("worker1", "t.drop_kept_then_count", 0) == 0);
    SCHECK(Tracked::live == 0);
  });
  SCHECK(Tracked::live == 0);
  // A holder that dies stops holding: owned by worker1, held by worker3 only, which dies.
  simulate(4, [](Agent& a) {
    if (a.rank() != 0) return;
    RRef<Tracked> r = a.remote<Tracked>("worker1", "t.make_tracked", 11);
    a.rpc_sync("worker3", "t.keep", r);
    r = RRef<Tracked>();
    SCHECK(a.rpc_sync<std::int64_t>("worker1", "t.owned") == 1);
    SCHECK_THAT(error_of([&] { a.rpc_sync("worker3", "t.die"); }), Contains("PeerLostError"));
    SCHECK(a.rpc_sync<std::int64_t>("worker1", "t.wait_lost_then_owned", 3) == 0);
  });
  {
    std::lock_guard<std::mutex> lock(g_kept_mutex);
    g_kept.reset();  // worker3's handle (its agent is gone: the release goes nowhere)
  }
  SCHECK(Tracked::live == 0);
  // An RRef in the reply to a caller that was lost while the call ran: the
  // owner counts no hold for it (nobody can release one), the value goes.
  simulate(4, [](Agent& a) {
    if (a.rank() != 0) return;
    SCHECK_THAT(error_of([&] { a.rpc_sync("worker3", "t.ask_make_for_me", 1); }), Contains("PeerLostError"));
    std::int64_t owned = -1;
    for (int i = 0; i < 500 && (owned = a.rpc_sync<std::int64_t>("worker1", "t.owned")) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    SCHECK(owned == 0);
  });
  SCHECK(Tracked::live == 0);
}

TEST_CASE("rpc gradient contexts: deposits sum on the owner, release drops them, a dead creator's are dropped",
          "[rpc]") {
  register_test_functions();
  simulate(3, [](Agent& a) {
    if (a.rank() != 0) return;
    RRef<Tensor> p = a.remote<Tensor>("worker1", "t.make_param", 4);
    RRef<Tensor> q = a.remote<Tensor>("worker2", "t.make_param", 4);
    const Tensor g1 = Tensor::from_vector(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f});
    const Tensor g2 = Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f, 4.f});
    {
      GradContext ctx = a.new_context();
      SCHECK(ctx.creator_rank() == 0);
      ctx.deposit(p, g1).get();
      ctx.deposit_all({{p, g2}, {q, g2}}).get();
      ctx.deposits_done().get();
      Tensor want = g1.clone();
      for (int i = 0; i < 4; ++i) want.data<float>()[i] = g1.data<float>()[i] + g2.data<float>()[i];
      SCHECK(same_bits(a.rpc_sync<Tensor>("worker1", "t.ctx_grad", ctx.id(), p), want));
      SCHECK(same_bits(a.rpc_sync<Tensor>("worker2", "t.ctx_grad", ctx.id(), q), g2));
      SCHECK_FALSE(a.rpc_sync<Tensor>("worker2", "t.ctx_grad", ctx.id() + 1, q).defined());
      GradContext other = a.new_context();
      SCHECK(other.id() != ctx.id());
      SCHECK(a.rpc_sync<std::int64_t>("worker1", "t.contexts") == 1);
      ctx.release();
      SCHECK_THROWS_AS(ctx.deposit(p, g1), StateError);
    }  // the handles go: released
    SCHECK(a.rpc_sync<std::int64_t>("worker1", "t.contexts") == 0);
    SCHECK(a.rpc_sync<std::int64_t>("worker2", "t.contexts") == 0);
    // worker2 makes a context, deposits for p (on worker1) and dies: worker1 drops it
    SCHECK_THAT(error_of([&] { a.rpc_sync("worker2", "t.deposit_then_die", p); }), Contains("PeerLostError"));
    SCHECK(a.rpc_sync<std::int64_t>("worker1", "t.wait_lost_then_contexts", 2) == 0);
  });
  g_dead_ctx.reset();
}

TEST_CASE("rpc shutdown is graceful: work sent just before it still completes", "[rpc]") {
  register_test_functions();
  g_count_once = 0;
  simulate(5, [](Agent& a) {
    // fire and forget, then shut down at once (simulate does)
    (void)a.rpc_async<int>((a.rank() + 1) % 5, "t.count_once");
  });
  SCHECK(g_count_once == 5);
}

TEST_CASE("rpc simulate rethrows a worker's failure and its peers see it die", "[rpc]") {
  register_test_functions();
  CHECK_THROWS_AS(simulate(3,
                           [](Agent& a) {
                             if (a.rank() == 2) throw ValueError("test", "worker 2 fails");
                             if (a.rank() == 0) {
                               SCHECK(a.wait_until_lost(2, std::chrono::seconds(30)));
                               SCHECK_THAT(error_of([&] { a.rpc_sync<std::string>(2, "t.whoami"); }),
                                          Contains("PeerLostError"));
                             }
                           }),
                  ValueError);
}

// --- deterministic simulation (rpc::simulate with deterministic = true) ---------------------

namespace {

/// Calls between 3 workers (free functions, nested calls, a counter's strand);
/// returns what worker 0 saw, in order.
std::vector<std::string> calls_under(const rpc::SimulateOptions& o) {
  register_test_functions();
  std::mutex m;
  std::vector<std::string> seen;
  rpc::simulate(3, [&](Agent& a) {
    std::vector<Future<Tensor>> fs;
    for (int r = 0; r < 3; ++r) fs.push_back(a.rpc_async<Tensor>(r, "t.add", Tensor::full({2}, a.rank()), 0.5 * r));
    for (int r = 0; r < 3; ++r)
      SCHECK(same_bits(fs[static_cast<std::size_t>(r)].get(), Tensor::full({2}, a.rank() + 0.5 * r)));
    const int nested = a.rpc_sync<int>((a.rank() + 1) % 3, "t.nested", 0, 3);
    SCHECK(nested == 3 + (a.rank() + 1) % 3);
    if (a.rank() == 0) {
      auto c = a.remote<Counter>("worker2", "t.make_counter");
      std::vector<Future<void>> bumps;
      for (int i = 0; i < 5; ++i) bumps.push_back(c.rpc_async("t.bump", i));
      for (auto& f : bumps) f.get();
      const long total = c.rpc_sync<long>("t.get");
      std::lock_guard<std::mutex> lock(m);
      seen.push_back("counter " + std::to_string(total));
    }
    std::lock_guard<std::mutex> lock(m);
    seen.push_back("worker" + std::to_string(a.rank()) + " nested " + std::to_string(nested));
  }, o);
  return seen;
}

rpc::SimulateOptions deterministic(std::uint64_t seed, SimReport* report = nullptr) {
  rpc::SimulateOptions o;
  o.deterministic = true;
  o.seed = seed;
  o.report = report;
  o.keep_trace = report != nullptr;
  return o;
}

/// What a sim::swarm body gets (seed, faults, report, keep_trace), for rpc::simulate.
rpc::SimulateOptions rpc_options_of(const dopt::SimulateOptions& s) {
  rpc::SimulateOptions r;
  r.deterministic = true;
  r.seed = s.seed;
  r.faults = s.faults;
  r.report = s.report;
  r.keep_trace = s.keep_trace;
  return r;
}

}  // namespace

TEST_CASE("rpc deterministic: a seed gives one schedule, replayed exactly, seeds differ", "[rpc][sim]") {
  std::set<std::uint64_t> hashes;
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    SimReport r1, r2;
    const auto seen1 = calls_under(deterministic(seed, &r1));
    const auto seen2 = calls_under(deterministic(seed, &r2));
    INFO("seed " << seed);
    CHECK(sim::compare_traces(r1, r2) == "");
    CHECK(r1.trace_hash == r2.trace_hash);
    CHECK(r1.decisions > 50);
    CHECK(r1.trace == r2.trace);
    CHECK(seen1 == seen2);  // the order in which the workers finished, too
    CHECK(seen1.size() == 4u);
    CHECK(std::count(seen1.begin(), seen1.end(), std::string("counter 10")) == 1);
    hashes.insert(r1.trace_hash);
  }
  if (!sim::env_seed()) CHECK(hashes.size() == 3u);  // three seeds, three schedules (DOPT_SIM_SEED: one)
  // the agents, their pool threads and the workers are the scheduler's tasks
  SimReport r;
  (void)calls_under(deterministic(4, &r));
  auto has = [&](const std::string& s) {
    return std::any_of(r.trace.begin(), r.trace.end(), [&](const std::string& l) { return l.find(s) != std::string::npos; });
  };
  CHECK(has("rpc agent"));
  CHECK(has("rpc pool"));
  CHECK(has("after rpc"));
}

TEST_CASE("rpc deterministic: a worker crashed at its k-th call, in virtual time", "[rpc][sim]") {
  register_test_functions();
  for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    SimReport report;
    auto o = deterministic(seed, &report);
    o.faults.crash(2, 2);  // worker 2 dies when it starts serving its 2nd call
    std::atomic<int> lost{0};
    rpc::simulate(3, [&](Agent& a) {
      if (a.rank() != 0) return;
      SCHECK(a.rpc_sync<std::string>(2, "t.whoami") == "worker2");
      const std::string e = error_of([&] { a.rpc_sync<std::string>(2, "t.whoami"); });
      SCHECK_THAT(e, Contains("PeerLostError") && Contains("worker2") && Contains("rank 2") && Contains("t.whoami"));
      if (e.find("PeerLostError") != std::string::npos) ++lost;
      // the others go on; later calls to it fail at once
      SCHECK(a.rpc_sync<std::string>(1, "t.whoami") == "worker1");
      SCHECK_THAT(error_of([&] { a.rpc_sync<int>(2, "t.count_once"); }), Contains("PeerLostError"));
    }, o);
    INFO("seed " << seed);
    CHECK(lost == 1);
    REQUIRE(report.faults.size() == 1u);
    CHECK_THAT(report.faults[0], Contains("rank 2 crashed at its call 2"));
  }
  // a worker crashed at a call it makes itself (its own thread)
  {
    auto o = deterministic(9);
    o.faults.crash(1, 1);
    std::atomic<bool> reached{false};
    rpc::simulate(3, [&](Agent& a) {
      if (a.rank() == 1) {
        (void)a.rpc_sync<std::string>(0, "t.whoami");  // never returns: the worker is gone
        reached = true;
      }
      if (a.rank() == 0) SCHECK(a.wait_until_lost(1, std::chrono::seconds(30)));
    }, o);
    CHECK_FALSE(reached);
  }
  // fault plans need deterministic = true
  rpc::SimulateOptions threaded;
  threaded.faults.crash(1, 1);
  if (!sim::env_seed()) CHECK_THROWS_AS(rpc::simulate(2, [](Agent&) {}, threaded), ValueError);
}

TEST_CASE("rpc deterministic: a dropped request times out in virtual time, a retry recovers it, late messages",
          "[rpc][sim]") {
  register_test_functions();
  g_count_once = 0;
  SimReport report;
  auto o = deterministic(3, &report);
  o.faults.drop_message(0, 1);  // worker 0's first message (its first request)
  const auto t0 = std::chrono::steady_clock::now();
  // The other workers shut down (and send their own messages) only after
  // worker 0's call: its first message is its request.
  Promise<void> done;
  rpc::simulate(3, [&](Agent& a) {
    if (a.rank() != 0) return done.get_future().wait();
    // 10 s deadline, 2 retries: the first attempt is lost, the second runs it
    SCHECK(a.rpc_sync<int>(1, Fn("t.count_once", {.timeout = std::chrono::seconds(10), .retries = 2})) == 1);
    done.set_value();
  }, o);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // virtual time
  CHECK(report.virtual_time >= std::chrono::seconds(10));
  REQUIRE(report.faults.size() == 1u);
  CHECK_THAT(report.faults[0], Contains("dropped"));
  CHECK(g_count_once == 1);
  // without retries the call fails with TimeoutError
  auto o2 = deterministic(3);
  o2.faults.drop_message(0, 1);
  Promise<void> done2;
  rpc::simulate(3, [&](Agent& a) {
    if (a.rank() != 0) return done2.get_future().wait();
    SCHECK_THAT(error_of([&] { a.rpc_sync<int>(1, Fn("t.count_once", {.timeout = std::chrono::seconds(10)})); }),
                Contains("TimeoutError") && Contains("10000 ms"));
    done2.set_value();
  }, o2);
  // every message late by up to 50 ms with probability 0.5: same results, replayed exactly
  SimReport d1, d2;
  auto late = [&](SimReport* r) {
    auto o3 = deterministic(11, r);
    o3.faults.delay_messages(-1, 0.5, std::chrono::milliseconds(50));
    return calls_under(o3);
  };
  const auto s1 = late(&d1);
  const auto s2 = late(&d2);
  CHECK(s1 == s2);
  CHECK(sim::compare_traces(d1, d2) == "");
  CHECK(d1.virtual_time > std::chrono::milliseconds(0));
}

TEST_CASE("rpc deterministic: an RRef that reaches its owner before the remote() making it: local_value waits for "
          "the value, or times out naming what never came",
          "[rpc][sim]") {
  register_test_functions();
  // Worker 0's messages late: its remote() to worker 1 can arrive after the
  // call that hands worker 1 the RRef (as DistributedOptimizer's create does).
  dopt::SimulateOptions base;
  base.faults.delay_messages(0, 0.5, std::chrono::milliseconds(20));
  sim::SwarmOptions swarm;
  swarm.seeds = 30;
  swarm.print = false;
  const auto found = sim::swarm([](const dopt::SimulateOptions& s) {
    rpc::simulate(3, [](Agent& a) {
      if (a.rank() != 0) return;
      RRef<Tracked> t = a.remote<Tracked>("worker1", "t.make_tracked", 7);
      const int v = a.rpc_sync<int>(1, "t.local_value_of", t);
      if (v != 7) throw std::runtime_error("local_value gave " + std::to_string(v));
    }, rpc_options_of(s));
  }, swarm, base);
  INFO(found.failure);
  CHECK_FALSE(found.failing_seed.has_value());
  CHECK(found.tried >= 1);  // DOPT_SIM_SEED (the CTest swarm) runs its seed only
  // The remote() lost (its request dropped, no retry): the owner's wait ends
  // at its rpc_timeout, in virtual time, saying what never came.
  SimReport report;
  auto o = deterministic(5, &report);
  o.rpc.rpc_timeout = std::chrono::seconds(2);
  o.faults.drop_message(0, 1);  // worker 0's first message: the remote() request
  std::string seen;
  Promise<void> done;  // the others shut down (and send) only after worker 0's calls
  rpc::simulate(3, [&](Agent& a) {
    if (a.rank() != 0) return done.get_future().wait();
    RRef<Tracked> t = a.remote<Tracked>("worker1", "t.make_tracked", 7);
    seen = error_of([&] { a.rpc_sync<int>(1, Fn("t.local_value_of", {.timeout = std::chrono::seconds(10)}), t); });
    done.set_value();
  }, o);
  REQUIRE(report.faults.size() == 1u);
  CHECK_THAT(report.faults[0], Contains("dropped"));
  CHECK_THAT(seen, Contains("TimeoutError") && Contains("no remote() making the value reached worker 'worker1'") &&
                       Contains("2000 ms"));
}

namespace {

// The scenario of examples/snippets/sim_rpc.cpp (docs/testing.md).
struct DocServer {
  double total = 0;
};

void doc_check_server(const rpc::SimulateOptions& options) {
  static std::once_flag once;
  std::call_once(once, [] {
    register_function("t.ps.make", [] { return DocServer{}; });
    register_method<DocServer>("t.ps.add", [](DocServer& s, double x) { return s.total += x; });
    register_method<DocServer>("t.ps.total", [](DocServer& s) { return s.total; });
  });
  rpc::simulate(3, [](Agent& agent) {
    if (agent.rank() != 0) return;
    RRef<DocServer> server = agent.remote<DocServer>("worker1", "t.ps.make");
    std::vector<Future<double>> adds;
    for (int i = 1; i <= 4; ++i) adds.push_back(server.rpc_async<double>("t.ps.add", i));
    for (auto& f : adds) f.get();
    if (server.rpc_sync<double>("t.ps.total") != 10) throw std::runtime_error("an update was lost");
  }, options);
}

}  // namespace

TEST_CASE("rpc deterministic: the parameter server of docs/testing.md, a crash, a swarm with late messages",
          "[rpc][sim]") {
  auto o = deterministic(42);
  doc_check_server(o);
  o.faults.crash(1, 3);
  CHECK_THROWS_WITH(doc_check_server(o), Contains("worker1") && Contains("rank 1"));
  CHECK_THROWS_AS(doc_check_server(o), PeerLostError);
  dopt::SimulateOptions base;
  base.faults.delay_messages(-1, 0.1, std::chrono::milliseconds(20));
  sim::SwarmOptions swarm;
  swarm.seeds = 20;
  swarm.print = false;
  const auto found = sim::swarm([](const dopt::SimulateOptions& s) { doc_check_server(rpc_options_of(s)); }, swarm, base);
  INFO(found.failure);
  CHECK_FALSE(found.failing_seed.has_value());
  CHECK(found.tried >= 1);
}
