// BufferPool: reuse by size, the bound on what it keeps, leases across threads.
#include "dopt/runtime/internal/buffer_pool.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <thread>
#include <vector>

using dopt::BufferPool;
using dopt::BufferPoolOptions;

TEST_CASE("buffer pool: a returned buffer serves the next request it fits", "[buffer_pool]") {
  BufferPool pool;
  std::byte* first = nullptr;
  {
    auto a = pool.take(std::size_t(1) << 20);
    REQUIRE(a);
    CHECK(a.capacity() == std::size_t(1) << 20);
    std::memset(a.get(), 1, a.capacity());
    first = a.get();
  }
  CHECK(pool.free_bytes() == std::size_t(1) << 20);
  {
    auto b = pool.take(900 << 10);  // fits, and at least half the buffer
    CHECK(b.get() == first);
    CHECK(b.capacity() == std::size_t(1) << 20);
    CHECK(pool.free_bytes() == 0);
  }
  {
    auto c = pool.take(300 << 10);  // would waste more than half: a new one
    CHECK(c.get() != first);
    CHECK(c.capacity() == std::size_t(300) << 10);
    auto d = pool.take(2 << 20);  // larger than anything kept
    CHECK(d.capacity() == std::size_t(2) << 20);
  }
  CHECK(pool.free_bytes() == (std::size_t(1) << 20) + (std::size_t(300) << 10) + (std::size_t(2) << 20));
  pool.trim();
  CHECK(pool.free_bytes() == 0);
  CHECK_FALSE(pool.take(0));
}

TEST_CASE("buffer pool: small buffers are not kept, and the bound holds", "[buffer_pool]") {
  BufferPool pool(BufferPoolOptions{64 << 10, 3 << 20});
  { auto s = pool.take(1000); }
  CHECK(pool.free_bytes() == 0);
  {
    auto a = pool.take(1 << 20), b = pool.take(1 << 20), c = pool.take(2 << 20);
  }  // c returns last (declared last, destroyed first): the largest go first when over the bound
  CHECK(pool.free_bytes() <= std::size_t(3) << 20);
  CHECK(pool.free_bytes() >= std::size_t(2) << 20);
  BufferPool none(BufferPoolOptions{64 << 10, 0});
  { auto x = none.take(1 << 20); }
  CHECK(none.free_bytes() == 0);
}

TEST_CASE("buffer pool: leases move, return from other threads, and outlive the pool", "[buffer_pool]") {
  BufferPool::Lease kept;
  {
    BufferPool pool;
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&pool, t] {
        for (int i = 0; i < 200; ++i) {
          auto l = pool.take(std::size_t(64 + (i + t) % 5 * 64) << 10);
          std::memset(l.get(), t, l.capacity());
          BufferPool::Lease moved = std::move(l);
          CHECK_FALSE(l);
          CHECK(moved);
        }
      });
    for (auto& t : ts) t.join();
    CHECK(pool.free_bytes() > 0);
    CHECK(pool.free_bytes() <= BufferPoolOptions{}.max_bytes);
    kept = pool.take(1 << 20);
  }
  std::memset(kept.get(), 7, kept.capacity());  // still valid after the pool is gone
  kept = BufferPool::Lease();                   // and freed, not returned, now
  CHECK_FALSE(kept);
}
