// Host-side parts of gpu/ that need no device: the multi-tensor plan, the
// caching allocator's bookkeeping (with a fake driver), NCCL error mapping.
#include <catch2/catch.hpp>

#include <atomic>
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

TEST_CASE("completion thread: done, failed, async error, deadline; continuations may watch again", "[gpu][host]") {
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
    w.keep = {t};
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
