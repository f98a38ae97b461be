// parallel_for (runtime/parallel.hpp).
#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dopt/runtime/internal/parallel.hpp"

TEST_CASE("parallel_for runs every item once, on up to the threads asked for", "[parallel][runtime]") {
  for (int threads : {1, 2, 3, 8}) {
    CAPTURE(threads);
    std::vector<std::atomic<int>> hits(1000);
    dopt::parallel_for(1000, threads, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)]++; });
    bool once = true;
    for (auto& h : hits) once = once && h.load() == 1;
    CHECK(once);
  }
  int calls = 0;
  dopt::parallel_for(0, 4, [&](std::int64_t) { ++calls; });
  dopt::parallel_for(-3, 4, [&](std::int64_t) { ++calls; });
  CHECK(calls == 0);
  CHECK(dopt::hardware_threads() >= 1);
}

TEST_CASE("parallel_for with one thread runs inline, in order", "[parallel][runtime]") {
  std::vector<std::int64_t> order;
  const auto me = std::this_thread::get_id();
  bool same_thread = true;
  dopt::parallel_for(50, 1, [&](std::int64_t i) {
    order.push_back(i);
    same_thread = same_thread && std::this_thread::get_id() == me;
  });
  std::vector<std::int64_t> want(50);
  for (std::int64_t i = 0; i < 50; ++i) want[static_cast<std::size_t>(i)] = i;
  CHECK(order == want);
  CHECK(same_thread);
}

TEST_CASE("parallel_for rethrows an item's exception after every item ran", "[parallel][runtime]") {
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(dopt::parallel_for(200, 4,
                                       [&](std::int64_t i) {
                                         ran++;
                                         if (i == 17) throw std::runtime_error("item 17 failed");
                                       }),
                    "item 17 failed");
  CHECK(ran.load() == 200);
  // The pool is usable afterwards.
  std::atomic<int> after{0};
  dopt::parallel_for(10, 4, [&](std::int64_t) { after++; });
  CHECK(after.load() == 10);
}

TEST_CASE("parallel_for: a nested call runs inline, concurrent callers take turns", "[parallel][runtime]") {
  std::atomic<int> inner{0};
  dopt::parallel_for(8, 4, [&](std::int64_t) { dopt::parallel_for(5, 4, [&](std::int64_t) { inner++; }); });
  CHECK(inner.load() == 40);

  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int k = 0; k < 20; ++k) dopt::parallel_for(30, 3, [&](std::int64_t) { total++; });
    });
  for (auto& t : callers) t.join();
  CHECK(total.load() == 3 * 20 * 30);
}
