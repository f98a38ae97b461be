// Quoted by docs/data.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <cstdint>
#include <vector>

#include "dopt/runtime/distributed_sampler.hpp"

// The indices this rank trains on, epoch after epoch: torch's
// DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=seed)
// with set_epoch(epoch) gives the same lists.
void epochs(std::int64_t dataset_size, int world_size, int rank, std::uint64_t seed, int epochs) {
  dopt::DistributedSampler sampler(dataset_size, world_size, rank, dopt::DistributedSamplerOptions().seed(seed));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);  // every rank, before its first batch of the epoch
    const std::vector<std::int64_t> mine = sampler.indices();
    for (std::size_t at = 0; at < mine.size(); at += 32) {
      // a batch of up to 32 samples: mine[at], mine[at + 1], ...
    }
  }
}
