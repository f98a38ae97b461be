// dopt::DistributedSampler on its own: the ranks' lists partition the
// (padded or cut) epoch, every epoch is a permutation, errors name the call.
// Index-for-index equality with torch's sampler: tests/sampler_torch.test.cpp.
#include "dopt/runtime/distributed_sampler.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include "dopt/runtime/error.hpp"

using dopt::DistributedSampler;
using dopt::DistributedSamplerOptions;

TEST_CASE("DistributedSampler: the ranks' lists cover the epoch once, padded by its head or cut to a multiple",
          "[sampler]") {
  for (std::int64_t n : {0, 1, 2, 7, 10, 11, 100}) {
    for (int world : {1, 2, 3, 5}) {
      for (bool drop_last : {false, true}) {
        for (bool shuffle : {false, true}) {
          INFO("n " << n << " world " << world << " drop_last " << drop_last << " shuffle " << shuffle);
          const auto opts = DistributedSamplerOptions().shuffle(shuffle).seed(7).drop_last(drop_last);
          std::map<std::int64_t, int> seen;
          std::int64_t taken = 0;
          for (int r = 0; r < world; ++r) {
            DistributedSampler s(n, world, r, opts);
            s.set_epoch(3);
            const auto idx = s.indices();
            CHECK(static_cast<std::int64_t>(idx.size()) == s.size());
            for (auto i : idx) {
              CHECK((i >= 0 && i < n));
              ++seen[i];
            }
            taken += static_cast<std::int64_t>(idx.size());
          }
          const std::int64_t per = drop_last ? n / world : (n + world - 1) / world;
          CHECK(taken == per * world);
          if (!drop_last) {
            CHECK(static_cast<std::int64_t>(seen.size()) == n);  // every sample at least once
            // Padding repeats the list's head: each sample at most ceil(total / n) times.
            for (auto& [i, k] : seen) CHECK(k <= (per * world + n - 1) / n);
          } else {
            for (auto& [i, k] : seen) CHECK(k == 1);
          }
        }
      }
    }
  }
}

TEST_CASE("DistributedSampler: an epoch is a permutation that changes with the epoch and seed, and repeats with them",
          "[sampler]") {
  DistributedSampler a(1000, 1, 0);
  const auto e0 = a.indices();
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 1000; ++i) REQUIRE(sorted[static_cast<std::size_t>(i)] == i);
  a.set_epoch(1);
  CHECK(a.indices() != e0);
  a.set_epoch(0);
  CHECK(a.indices() == e0);
  // seed + epoch is what counts (torch seeds its generator with the sum).
  DistributedSampler b(1000, 1, 0, DistributedSamplerOptions().seed(1));
  a.set_epoch(1);
  CHECK(b.indices() == a.indices());
  DistributedSampler plain(5, 2, 1, DistributedSamplerOptions().shuffle(false));
  CHECK(plain.indices() == std::vector<std::int64_t>{1, 3, 0});  // 0 1 2 3 4 | 0: rank 1 takes positions 1, 3, 5
}

TEST_CASE("DistributedSampler: bad arguments are ValueErrors naming the call", "[sampler]") {
  CHECK_THROWS_WITH(DistributedSampler(10, 2, 2), "DistributedSampler: rank 2 is outside [0, 1]");
  CHECK_THROWS_WITH(DistributedSampler(10, 0, 0), "DistributedSampler [rank 0]: num_replicas must be at least 1, got 0");
  CHECK_THROWS_WITH(DistributedSampler(-1, 1, 0), "DistributedSampler [rank 0]: dataset_size must be non-negative, got -1");
  CHECK_THROWS_AS(DistributedSampler(10, 2, -1), dopt::ValueError);
}
