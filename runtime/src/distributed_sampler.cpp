// dopt::DistributedSampler (distributed_sampler.hpp).
#include "dopt/runtime/distributed_sampler.hpp"

#include <numeric>
#include <random>
#include <string>

#include "dopt/runtime/error.hpp"

namespace dopt {

std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed) {
  if (n < 0) throw ValueError("torch_randperm", "n must be non-negative, got " + std::to_string(n));
  std::vector<std::int64_t> r(static_cast<std::size_t>(n));
  std::iota(r.begin(), r.end(), std::int64_t{0});
  // torch's CPU generator is the standard MT19937 seeded with the low 32
  // bits of the seed; randperm swaps position i with i + (draw % (n - i)).
  std::mt19937 engine(static_cast<std::uint32_t>(seed & 0xffffffffu));
  for (std::int64_t i = 0; i < n - 1; ++i) {
    const auto z = static_cast<std::int64_t>(static_cast<std::uint64_t>(engine()) % static_cast<std::uint64_t>(n - i));
    std::swap(r[static_cast<std::size_t>(i)], r[static_cast<std::size_t>(z + i)]);
  }
  return r;
}

DistributedSampler::DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  const char* op = "DistributedSampler";
  if (dataset_size < 0) throw ValueError(op, "dataset_size must be non-negative, got " + std::to_string(dataset_size), rank);
  if (num_replicas < 1) throw ValueError(op, "num_replicas must be at least 1, got " + std::to_string(num_replicas), rank);
  if (rank < 0 || rank >= num_replicas)
    throw ValueError(op, "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(num_replicas - 1) + "]");
  // torch: ceil((n - R) / R) with drop_last and a remainder, which is n / R
  // rounded down (0 when n < R); else ceil(n / R).
  const std::int64_t r = num_replicas;
  num_samples_ = options_.drop_last() && dataset_size % r != 0 ? dataset_size / r : (dataset_size + r - 1) / r;
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  std::vector<std::int64_t> all;
  if (options_.shuffle()) {
    all = torch_randperm(dataset_size_, options_.seed() + static_cast<std::uint64_t>(epoch_));
  } else {
    all.resize(static_cast<std::size_t>(dataset_size_));
    std::iota(all.begin(), all.end(), std::int64_t{0});
  }
  const auto total = static_cast<std::size_t>(total_size());
  if (all.size() < total) {  // pad by repeating the head (only without drop_last)
    const std::size_t have = all.size();
    for (std::size_t k = 0; all.size() < total; ++k) all.push_back(all[k % have]);
  }
  all.resize(total);
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(num_samples_));
  for (std::size_t k = static_cast<std::size_t>(rank_); k < total; k += static_cast<std::size_t>(num_replicas_))
    mine.push_back(all[k]);
  return mine;
}

}  // namespace dopt
