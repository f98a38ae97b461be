// dopt::rpc between simulated workers (one process): calls, errors,
// deadlines, idempotency, RRefs and their lifetime, gradient contexts,
// graceful shutdown. No sleeps: workers that only serve return from their fn
// at once and serve from shutdown() until worker 0 (the driver) is done.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>

#include "dopt/actors/rpc.hpp"
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
struct Tracked {
  static std::atomic<int> live;
  int value = 0;
  Tracked() { ++live; }
  explicit Tracked(int v) : value(v) { ++live; }
  Tracked(const Tracked& o) : value(o.value) { ++live; }
  Tracked(Tracked&& o) noexcept : value(o.value) { ++live; }
  Tracked& operator=(const Tracked&) = default;
  ~Tracked() { --live; }
};
std::atomic<int> Tracked::live{0};
void dopt_encode(Encoder& e, const Tracked& t) { write(e, t.value); }
void dopt_decode(Decoder& d, Tracked& t) { read(d, t.value); }

struct Counter {
  long n = 0;
};

std::atomic<int> g_count_once{0};
std::mutex g_gate_mutex;
std::optional<std::promise<void>> g_gate;
std::shared_future<void> g_gate_future;
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
      std::shared_future<void> f;
      {
        std::lock_guard<std::mutex> lock(g_gate_mutex);
        f = g_gate_future;
      }
      f.wait();
      return 1;
    });
    register_function("t.count_then_wait_gate", [] {
      ++g_count_once;
      std::shared_future<void> f;
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
std::mutex g_catch_mutex;
#define SCHECK(...) do { std::lock_guard<std::mutex> l_(g_catch_mutex); CHECK(__VA_ARGS__); } while (0)
#define SCHECK_FALSE(...) do { std::lock_guard<std::mutex> l_(g_catch_mutex); CHECK_FALSE(__VA_ARGS__); } while (0)
#define SCHECK_THAT(a, m) do { std::lock_guard<std::mutex> l_(g_catch_mutex); CHECK_THAT(a, m); } while (0)
#define SCHECK_THROWS_AS(e, T) do { std::lock_guard<std::mutex> l_(g_catch_mutex); CHECK_THROWS_AS(e, T); } while (0)


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
    g_gate_future = g_gate->get_future().share();
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
    g_gate_future = g_gate->get_future().share();
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
  std::promise<void> made;
  auto made_f = made.get_future().share();
  std::atomic<int> done_bumping{0};
  simulate(n, [&](Agent& a) {
    if (a.rank() == 0) {
      RRef<Tracked> t = a.remote<Tracked>("worker1", "t.make_tracked", 42);
      SCHECK(t.owner().name == "worker1");
      SCHECK_FALSE(t.is_owner());
      SCHECK(t.to_here().value == 42);
      SCHECK(t.rpc_sync<int>("t.tracked_value") == 1042);
      SCHECK_THROWS_AS(t.local_value(), StateError);
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
      {
        std::lock_guard<std::mutex> lock(m);
        shared = a.remote<Counter>("worker2", "t.make_counter");
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
    }
    c = RRef<Counter>();
    if (a.rank() == 0) {
      std::lock_guard<std::mutex> lock(m);
      shared.reset();
    }
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
