#pragma once
// dopt::DistributedSampler: which samples of a dataset each rank takes in an
// epoch, index for index what torch.utils.data.DistributedSampler (torch
// 1.13) gives the same rank, so that a dopt trainer and a torch one see the
// same batches (docs/data.md).
//
// Contract:
//   * every rank constructs it with the same dataset size, num_replicas,
//     seed, shuffle and drop_last, and its own rank; every rank calls
//     set_epoch(e) with the same e before indices(); nothing is exchanged
//     between ranks (the order is a pure function of seed + epoch);
//   * any thread; an object is not safe to use from two threads at once
//     (set_epoch writes it), const calls are;
//   * shuffle: a permutation of [0, size) drawn as torch.randperm(size,
//     generator=torch.Generator().manual_seed(seed + epoch)) draws it (an
//     MT19937 seeded with the low 32 bits of seed + epoch, one Fisher-Yates
//     swap per draw); not shuffled: 0, 1, ..., size - 1;
//   * without drop_last the list is padded to a multiple of num_replicas by
//     repeating its head (so some samples are seen twice in an epoch); with
//     drop_last its tail is cut to a multiple instead;
//   * rank r takes every num_replicas-th index from position r.
// Errors: dopt::ValueError("DistributedSampler", ...) for a negative size,
// num_replicas < 1 or a rank outside [0, num_replicas).
#include <cstdint>
#include <vector>

namespace dopt {

/// The options, torch's defaults: shuffled, seed 0, padded (no drop_last).
struct DistributedSamplerOptions {
  DistributedSamplerOptions& shuffle(bool v) {
    shuffle_ = v;
    return *this;
  }
  DistributedSamplerOptions& seed(std::uint64_t v) {
    seed_ = v;
    return *this;
  }
  DistributedSamplerOptions& drop_last(bool v) {
    drop_last_ = v;
    return *this;
  }
  bool shuffle() const noexcept { return shuffle_; }
  std::uint64_t seed() const noexcept { return seed_; }
  bool drop_last() const noexcept { return drop_last_; }

 private:
  bool shuffle_ = true;
  std::uint64_t seed_ = 0;
  bool drop_last_ = false;
};

class DistributedSampler {
 public:
  /// dataset_size samples, split over num_replicas ranks (usually the
  /// world's size), for `rank`.
  DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank,
                     DistributedSamplerOptions options = {});

  /// The epoch whose order indices() gives (torch's set_epoch; 0 at first).
  void set_epoch(std::int64_t epoch) noexcept { epoch_ = epoch; }
  std::int64_t epoch() const noexcept { return epoch_; }

  /// This rank's sample indices for the current epoch, in order; size() of them.
  std::vector<std::int64_t> indices() const;

  /// How many samples each rank takes per epoch (torch's len(sampler)).
  std::int64_t size() const noexcept { return num_samples_; }
  /// size() * num_replicas: the padded (or cut) length of the epoch's list.
  std::int64_t total_size() const noexcept { return num_samples_ * num_replicas_; }

 private:
  std::int64_t dataset_size_;
  int num_replicas_, rank_;
  DistributedSamplerOptions options_;
  std::int64_t num_samples_ = 0;
  std::int64_t epoch_ = 0;
};

/// torch.randperm(n, generator=g) for g = torch.Generator().manual_seed(seed)
/// in torch 1.13 on the CPU: the same permutation of [0, n).
std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed);

}  // namespace dopt
