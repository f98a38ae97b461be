// Host-side parts of gpu/ that need no device: the multi-tensor plan, the
// caching allocator's bookkeeping (with a fake driver), NCCL error mapping,
// waiting for nonblocking NCCL calls, the default device, the completion
// thread (fake probes) and the tests' NaN-as-a-class comparison.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "caching_pool.hpp"
#include "multi_tensor.hpp"
#include "nccl_errors.hpp"

using namespace dopt;
using namespace dopt::gpu::detail;

namespace {

// Checks that the plan covers every element of every tensor exactly once, in
// order, within the limits.
void check_plan(const std::vector<std::int64_t>& numels, int max_t, int max_b, std::int64_t chunk) {
  const auto plans = plan_multi_tensor(numels, max_t, max_b, chunk);
  std::map<int, std::set<int>> seen;  // tensor -> chunks
  for (const auto& p : plans) {
    REQUIRE(!p.blocks.empty());
    REQUIRE(static_cast<int>(p.tensors.size()) <= max_t);
    REQUIRE(static_cast<int>(p.blocks.size()) <= max_b);
    for (auto [slot, c] : p.blocks) {
      REQUIRE(slot >= 0);
      REQUIRE(slot < static_cast<int>(p.tensors.size()));
      const int t = p.tensors[static_cast<std::size_t>(slot)];
      REQUIRE(c >= 0);
      REQUIRE(static_cast<std::int64_t>(c) * chunk < numels[static_cast<std::size_t>(t)]);
      REQUIRE(seen[t].insert(c).second);  // no chunk twice
    }
  }
  for (std::size_t t = 0; t < numels.size(); ++t) {
    const std::int64_t chunks = numels[t] <= 0 ? 0 : (numels[t] + chunk - 1) / chunk;
    CHECK(static_cast<std::int64_t>(seen[static_cast<int>(t)].size()) == chunks);
  }
}

}  // namespace

TEST_CASE("multi-tensor plan: every chunk of every tensor in exactly one block", "[gpu][host]") {
  SECTION("defaults, a mix of sizes") {
    check_plan({1, 65536, 65537, 0, 3, 1 << 20, 100'000'000}, kMaxTensors, kMaxBlocks, kChunk);
  }
  SECTION("small limits force tensors to continue in the next launch") {
    check_plan({10, 25, 7, 0, 31, 1, 64}, 2, 3, 4);
    check_plan({100}, 1, 1, 7);
  }
  SECTION("random lists") {
    std::mt19937 rng(12345);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::int64_t> n(rng() % 40);
      for (auto& x : n) x = static_cast<std::int64_t>(rng() % 5) == 0 ? 0 : static_cast<std::int64_t>(rng() % 300);
      const int mt = 1 + static_cast<int>(rng() % 5), mb = 1 + static_cast<int>(rng() % 9);
      check_plan(n, mt, mb, 1 + static_cast<std::int64_t>(rng() % 17));
    }
  }
  SECTION("a tensor split across launches keeps its chunks in order") {
    const auto plans = plan_multi_tensor({10}, 4, 2, 1);
    REQUIRE(plans.size() == 5);
    int next = 0;
    for (const auto& p : plans) {
      REQUIRE(p.tensors == std::vector<int>{0});
      for (auto [slot, c] : p.blocks) {
        CHECK(slot == 0);
        CHECK(c == next++);
      }
    }
  }
  SECTION("nothing to do") {
    CHECK(plan_multi_tensor({}).empty());
    CHECK(plan_multi_tensor({0, 0}).empty());
  }
}

TEST_CASE("caching pool: reuse, rounding, release and out-of-memory retry (fake driver)", "[gpu][host]") {
  std::map<void*, std::pair<std::size_t, int>> live;  // what the fake driver handed out
  std::size_t budget = 4096;                          // bytes the fake device has
  std::size_t used = 0;
  int frees = 0;
  CachingPool pool(
      [&](std::size_t n, int dev) -> void* {
        if (used + n > budget) return nullptr;
        used += n;
        void* p = std::malloc(n);
        live[p] = {n, dev};
        return p;
      },
      [&](void* p, int) {
        used -= live.at(p).first;
        live.erase(p);
        std::free(p);
        ++frees;
      });
  CHECK(pool.allocate(0, 0) == nullptr);
  void* a = pool.allocate(100, 0);  // rounds to 512
  REQUIRE(a);
  CHECK(live.at(a).first == 512);
  CHECK(pool.counts(0).in_use == 512);
  pool.deallocate(a, 100, 0);
  CHECK(pool.counts(0).in_use == 0);
  CHECK(pool.counts(0).cached == 512);
  void* b = pool.allocate(512, 0);  // same rounded size: reused
  CHECK(b == a);
  CHECK(pool.counts(0).reused == 1);
  CHECK(pool.counts(0).raw_allocs == 1);
  void* c = pool.allocate(512, 1);  // other device: not reused across devices
  CHECK(c != a);
  CHECK(pool.counts(1).in_use == 512);
  // Cache a 1024-byte block, then ask for more than is left: the cache goes back first.
  void* d = pool.allocate(1000, 0);
  pool.deallocate(d, 1000, 0);
  CHECK(pool.counts(0).cached == 1024);
  void* e = pool.allocate(1536, 0);  // 512 + 512 + 1024 (cached) + 1536 of 4096 -> fits
  REQUIRE(e);
  void* f = pool.allocate(1536, 0);  // no cached 1536 block; fits only once the cached 1024 is released
  REQUIRE(f);
  CHECK(pool.counts(0).cached == 0);
  CHECK(frees == 1);
  CHECK_THROWS_AS(pool.allocate(4096, 0), DeviceError);  // nothing cached, still too big
  pool.deallocate(b, 512, 0);
  pool.deallocate(c, 512, 1);
  pool.deallocate(e, 1536, 0);
  pool.deallocate(f, 1536, 0);
  pool.release();
  CHECK(live.empty());
  CHECK(used == 0);
  CHECK(pool.counts(0).cached == 0);
  CHECK(pool.counts(1).cached == 0);
}

TEST_CASE("NCCL results map to dopt errors naming the op and the rank", "[gpu][host]") {
  CHECK(nccl_error(0, "op", 0) == nullptr);
  CHECK(nccl_error(7, "op", 0) == nullptr);  // in progress is not an error
  auto kind = [](int code) {
    try {
      std::rethrow_exception(nccl_error(code, "NcclProcessGroup.all_reduce", 3, "peer 2 closed"));
    } catch (const PeerLostError&) {
      return std::string("PeerLostError");
    } catch (const DeviceError&) {
      return std::string("DeviceError");
    } catch (const IOError&) {
      return std::string("IOError");
    } catch (const ValueError&) {
      return std::string("ValueError");
    } catch (const StateError&) {
      return std::string("StateError");
    } catch (const Error& e) {
      return std::string("Error");
    }
    return std::string("none");
  };
  CHECK(kind(1) == "DeviceError");
  CHECK(kind(2) == "IOError");
  CHECK(kind(3) == "Error");
  CHECK(kind(4) == "ValueError");
  CHECK(kind(5) == "StateError");
  CHECK(kind(6) == "PeerLostError");
  CHECK(kind(42) == "Error");
  try {
    std::rethrow_exception(nccl_error(6, "NcclProcessGroup.all_reduce", 3, "peer 2 closed"));
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("NcclProcessGroup.all_reduce") != std::string::npos);
    CHECK(what.find("ncclRemoteError") != std::string::npos);
    CHECK(what.find("peer 2 closed") != std::string::npos);
    REQUIRE(e.rank().has_value());
    CHECK(*e.rank() == 3);
  }
  CHECK(std::string(nccl_result_name(2)) == "ncclSystemError");
}

#include "dopt/actors/simulate.hpp"
#include "dopt/gpu/device.hpp"
#include "dopt/gpu/nccl.hpp"

TEST_CASE("without a CUDA device, NCCL groups and CUDA tensors fail with errors instead of hanging", "[gpu][host]") {
  if (dopt::gpu::init()) {
    SUCCEED("a device is present: the [gpu][nccl] tests cover the working path");
    return;
  }
  std::atomic<int> threw{0};
  dopt::simulate(2, [&](dopt::RankContext& ctx) {
    try {
      dopt::gpu::make_nccl_group(ctx.world(), 0);
    } catch (const dopt::Error&) {
      ++threw;
    }
  });
  CHECK(threw == 2);
  CHECK_THROWS_AS(Tensor::empty({4}, DType::float32, Device::cuda(0)), Error);
}

#include <thread>

#include "completion.hpp"

TEST_CASE("completion thread: done, failed, async error, deadline, continuations may watch again", "[gpu][host]") {
  using dopt::gpu::detail::Probe;
  using dopt::gpu::detail::Watch;
  using dopt::gpu::detail::watch;
  SECTION("pending until the probe says done; then() runs; kept tensors are released afterwards") {
    std::atomic<bool> done{false};
    Tensor t = Tensor::zeros({16});
    std::weak_ptr<Storage> storage = t.storage();
    Watch w;
    w.op = "test.op";
    w.probe = [&](std::string&) { return done ? Probe::done : Probe::pending; };
    w.keep = storages_of({t});
    t = Tensor();
    Future<void> f = w.promise.get_future();
    std::atomic<bool> ran{false};
    Future<void> g = f.then([&](Future<void> r) {
      r.get();
      ran = true;
    });
    watch(std::move(w));
    CHECK(!f.is_ready());  // the probe cannot say done before `done` is set
    CHECK(!storage.expired());
    done = true;
    g.get();
    CHECK(ran);
    // Released by the completion thread right after filling: wait (bounded) for it.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!storage.expired() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    CHECK(storage.expired());
  }
  SECTION("a failed probe is a DeviceError naming the op and the error") {
    Watch w;
    w.op = "Stream.completion";
    w.probe = [](std::string& why) {
      why = "cudaErrorIllegalAddress: an illegal memory access was encountered";
      return Probe::failed;
    };
    Future<void> f = w.promise.get_future();
    watch(std::move(w));
    try {
      f.get();
      FAIL("no error");
    } catch (const DeviceError& e) {
      const std::string what = e.what();
      CHECK(what.find("Stream.completion") != std::string::npos);
      CHECK(what.find("cudaErrorIllegalAddress") != std::string::npos);
    }
  }
  SECTION("poll_error fails the watch with its error") {
    std::atomic<int> polls{0};
    Watch w;
    w.op = "NcclProcessGroup.all_reduce";
    w.probe = [](std::string&) { return Probe::pending; };
    w.poll_error = [&]() -> std::exception_ptr {
      if (++polls < 3) return nullptr;
      return std::make_exception_ptr(PeerLostError("NcclProcessGroup.all_reduce", "rank 2 is gone", 0));
    };
    Future<void> f = w.promise.get_future();
    watch(std::move(w));
    CHECK_THROWS_AS(f.get(), PeerLostError);
    CHECK(polls >= 3);
  }
  SECTION("a passed deadline calls on_timeout once and fails with its error; TimeoutError without one") {
    std::atomic<int> calls{0};
    Watch w;
    w.op = "x";
    w.probe = [](std::string&) { return Probe::pending; };
    w.deadline = std::chrono::steady_clock::now() - std::chrono::milliseconds(1);
    w.on_timeout = [&]() -> std::exception_ptr {
      ++calls;
      return std::make_exception_ptr(TimeoutError("x", "aborted", 1));
    };
    Future<void> f = w.promise.get_future();
    watch(std::move(w));
    CHECK_THROWS_AS(f.get(), TimeoutError);
    CHECK(calls == 1);
    Watch v;
    v.op = "y";
    v.probe = [](std::string&) { return Probe::pending; };
    v.deadline = std::chrono::steady_clock::now();
    Future<void> h = v.promise.get_future();
    watch(std::move(v));
    CHECK_THROWS_AS(h.get(), TimeoutError);
  }
  SECTION("a continuation that hands in another watch does not deadlock") {
    Watch a;
    a.probe = [](std::string&) { return Probe::done; };
    Promise<void> second;
    Future<void> fa = a.promise.get_future();
    Future<void> chained = fa.then([second](Future<void>) {
      Watch b;
      b.probe = [](std::string&) { return Probe::done; };
      b.promise = second;
      watch(std::move(b));
    });
    watch(std::move(a));
    chained.get();
    second.get_future().get();
    SUCCEED();
  }
}

TEST_CASE("NCCL: a failure never becomes a null exception, the wait loop reports query failures and timeouts",
          "[gpu][host]") {
  // What a failed async-error query left behind (in progress, success) is still an error.
  for (int code : {0, 7}) {
    std::exception_ptr e = nccl_failure(code, "NcclProcessGroup.all_reduce", 2, "ncclCommGetAsyncError failed");
    REQUIRE(e != nullptr);
    CHECK_THROWS_AS(std::rethrow_exception(e), Error);
  }
  CHECK_THROWS_AS(std::rethrow_exception(nccl_failure(6, "op", 0)), PeerLostError);
  const auto far = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  SECTION("the query itself fails while the call is in progress") {
    int calls = 0;
    const NcclWaitResult w = wait_nccl(7, [&](int& r) { ++calls; r = 7; return 3; }, far);
    CHECK(w.query_failed);
    CHECK(w.code == 3);
    CHECK(!w.timed_out);
    CHECK(calls == 1);
  }
  SECTION("a query that fails with 'in progress' is an internal error, not success") {
    const NcclWaitResult w = wait_nccl(7, [](int& r) { r = 7; return 7; }, far);
    CHECK(w.query_failed);
    CHECK(w.code == 3);
  }
  SECTION("in progress until done") {
    int calls = 0;
    const NcclWaitResult w = wait_nccl(7, [&](int& r) { r = ++calls < 3 ? 7 : 0; return 0; }, far);
    CHECK(w.code == 0);
    CHECK(!w.query_failed);
    CHECK(calls == 3);
  }
  SECTION("an asynchronous error ends the wait with its code") {
    const NcclWaitResult w = wait_nccl(7, [](int& r) { r = 6; return 0; }, far);
    CHECK(w.code == 6);
    CHECK(!w.query_failed);
  }
  SECTION("still in progress at the deadline") {
    const NcclWaitResult w =
        wait_nccl(7, [](int& r) { r = 7; return 0; }, std::chrono::steady_clock::now() + std::chrono::milliseconds(5));
    CHECK(w.timed_out);
  }
  SECTION("a first result that is final is returned as it is") {
    CHECK(wait_nccl(0, [](int&) { return 0; }, far).code == 0);
    CHECK(wait_nccl(4, [](int&) { return 0; }, far).code == 4);
  }
}

TEST_CASE("NCCL's default device is the launcher's local rank, else the current device", "[gpu][host]") {
  CHECK(default_nccl_device(std::nullopt, 0, 8) == 0);
  CHECK(default_nccl_device(std::nullopt, 3, 8) == 3);
  CHECK(default_nccl_device(5, 0, 8) == 5);  // cudaGetDevice() says 0 in every fresh process
  CHECK(default_nccl_device(0, 2, 1) == 0);
  CHECK_THROWS_AS(default_nccl_device(2, 0, 2), ValueError);
  CHECK_THROWS_AS(default_nccl_device(0, 0, 0), ValueError);
  try {
    default_nccl_device(4, 0, 2);
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()).find("local rank is 4") != std::string::npos);
  }
}

#include "gpu_checks.hpp"

TEST_CASE("GPU tests compare with the CPU bit for bit, a NaN matching any NaN", "[gpu][host]") {
  using dopt::testing::same_bits_nan_as_class;
  auto f32 = [](std::uint32_t bits) {
    Tensor t = Tensor::empty({1}, DType::float32);
    std::memcpy(t.data_ptr(), &bits, 4);
    return t;
  };
  CHECK(same_bits_nan_as_class(f32(0x7fc00000u), f32(0xffc00001u)));   // NaNs of other sign and payload
  CHECK(same_bits_nan_as_class(f32(0x7fffffffu), f32(0x7f800001u)));   // canonical CUDA NaN vs a signalling one
  CHECK(!same_bits_nan_as_class(f32(0x7fc00000u), f32(0x7f800000u)));  // NaN vs infinity
  CHECK(!same_bits_nan_as_class(f32(0x00000000u), f32(0x80000000u)));  // +0 vs -0
  CHECK(!same_bits_nan_as_class(f32(0x3f800000u), f32(0x3f800001u)));  // one ulp
  CHECK(same_bits_nan_as_class(f32(0x3f800000u), f32(0x3f800000u)));
  auto half = [](DType dt, std::uint16_t bits) {
    Tensor t = Tensor::empty({1}, dt);
    std::memcpy(t.data_ptr(), &bits, 2);
    return t;
  };
  CHECK(same_bits_nan_as_class(half(DType::float16, 0x7e00), half(DType::float16, 0xfc01)));
  CHECK(!same_bits_nan_as_class(half(DType::float16, 0x7c00), half(DType::float16, 0x7e00)));
  CHECK(same_bits_nan_as_class(half(DType::bfloat16, 0x7fc0), half(DType::bfloat16, 0xff81)));
  CHECK(!same_bits_nan_as_class(half(DType::bfloat16, 0x7f80), half(DType::bfloat16, 0x7fc0)));
  Tensor d = Tensor::from_vector<double>({1.0, std::nan("1"), -2.0});
  Tensor e = Tensor::from_vector<double>({1.0, -std::nan("7"), -2.0});
  CHECK(same_bits_nan_as_class(d, e));
  CHECK(!same_bits_nan_as_class(d, e.to(DType::float32)));  // dtypes differ
}

TEST_CASE("completion thread: kept storages outlive set_data, deadlines start with the work, blocking "
          "continuations do not stall the others",
          "[gpu][host]") {
  using dopt::gpu::detail::Probe;
  using dopt::gpu::detail::Watch;
  using dopt::gpu::detail::watch;
  auto wait_ready = [](const Future<void>& f, std::chrono::milliseconds limit) { return f.wait_for(limit); };
  SECTION("a tensor re-pointed with set_data while its work is queued keeps its old storage until done") {
    std::atomic<bool> done{false};
    Tensor t = Tensor::zeros({1024});
    std::weak_ptr<Storage> old = t.storage();
    Watch w;
    w.op = "test.keep";
    w.probe = [&](std::string&) { return done ? Probe::done : Probe::pending; };
    w.keep = storages_of({t});
    Future<void> f = w.promise.get_future();
    watch(std::move(w));
    t.set_data(Tensor::zeros({1024}));  // like param.data = other while a kernel still reads the old bytes
    CHECK(!old.expired());              // a held Tensor handle would have let it go here
    done = true;
    f.get();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!old.expired() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    CHECK(old.expired());
  }
  SECTION("the timeout counts from the start event, not from the time queued behind earlier work") {
    std::atomic<bool> started{false}, done{false};
    Watch w;
    w.op = "NcclProcessGroup.all_reduce";
    w.start_probe = [&](std::string&) { return started ? Probe::done : Probe::pending; };
    w.probe = [&](std::string&) { return done ? Probe::done : Probe::pending; };
    w.timeout = std::chrono::milliseconds(50);
    Future<void> f = w.promise.get_future();
    watch(std::move(w));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // queued: 4x the timeout
    CHECK(!f.is_ready());
    started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    done = true;  // within the timeout after the start
    REQUIRE(wait_ready(f, std::chrono::seconds(10)));
    CHECK_NOTHROW(f.get());
    // Started but never done: times out about `timeout` after the start.
    Watch v;
    v.op = "x";
    v.start_probe = [](std::string&) { return Probe::done; };
    v.probe = [](std::string&) { return Probe::pending; };
    v.timeout = std::chrono::milliseconds(30);
    Future<void> g = v.promise.get_future();
    const auto t0 = std::chrono::steady_clock::now();
    watch(std::move(v));
    CHECK_THROWS_AS(g.get(), TimeoutError);
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(30));
    // A failed start is a DeviceError.
    Watch u;
    u.op = "y";
    u.start_probe = [](std::string& why) {
      why = "cudaErrorLaunchFailure";
      return Probe::failed;
    };
    u.probe = [](std::string&) { return Probe::pending; };
    Future<void> h = u.promise.get_future();
    watch(std::move(u));
    CHECK_THROWS_AS(h.get(), DeviceError);
  }
  SECTION("a continuation that waits for a later GPU future (a blocking step or collective) does not deadlock") {
    std::atomic<bool> second_done{false};
    Promise<void> second_promise;
    Future<void> second = second_promise.get_future();
    Watch a;
    a.op = "a";
    a.probe = [](std::string&) { return Probe::done; };
    Future<void> fa = a.promise.get_future();
    // Inside a's continuation: hand in b and wait for it, as Optimizer::step or
    // a first collective (NCCL communicator set-up) would.
    Future<void> chained = fa.then([second_promise, &second_done](Future<void>) {
      Watch b;
      b.op = "b";
      b.probe = [&second_done](std::string&) { return second_done ? Probe::done : Probe::pending; };
      b.promise = second_promise;
      Future<void> fb = b.promise.get_future();
      watch(std::move(b));
      second_done = true;
      fb.get();  // filled by another dispatcher: the blocked one is retired
    });
    watch(std::move(a));
    REQUIRE(wait_ready(chained, std::chrono::seconds(10)));
    CHECK_NOTHROW(chained.get());
    CHECK(second.is_ready());
  }
  SECTION("while one continuation blocks, other completions are still delivered, in order") {
    std::mutex m;
    std::condition_variable cv;
    bool release = false;
    Watch a;
    a.op = "blocking";
    a.probe = [](std::string&) { return Probe::done; };
    Future<void> blocked = a.promise.get_future().then([&](Future<void>) {
      std::unique_lock<std::mutex> l(m);
      cv.wait(l, [&] { return release; });  // e.g. a rank waiting for a peer in NCCL set-up
    });
    watch(std::move(a));
    std::vector<int> order;
    std::mutex om;
    std::vector<Future<void>> others;
    for (int i = 0; i < 5; ++i) {
      Watch w;
      w.op = "other";
      w.probe = [](std::string&) { return Probe::done; };
      others.push_back(w.promise.get_future().then([&, i](Future<void>) {
        std::lock_guard<std::mutex> l(om);
        order.push_back(i);
      }));
      watch(std::move(w));
    }
    bool all = true;
    for (auto& f : others) all = all && wait_ready(f, std::chrono::seconds(10));
    CHECK(all);
    CHECK(!blocked.is_ready());
    {
      std::lock_guard<std::mutex> l(om);
      CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
    }
    {
      std::lock_guard<std::mutex> l(m);
      release = true;
    }
    cv.notify_all();
    CHECK(wait_ready(blocked, std::chrono::seconds(10)));
    CHECK(dopt::gpu::detail::dispatchers_started() >= 2);
  }
}
