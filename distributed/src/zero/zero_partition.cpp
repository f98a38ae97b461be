// ZeroRedundancyOptimizer: the partition of the parameters over the ranks,
// and the per-rank flat buckets of parameters_as_bucket_view.
#include <algorithm>
#include <cmath>

#include "dopt/distributed/zero.hpp"
#include "zero_host_memory.hpp"

namespace dopt::optim {

void ZeroRedundancyOptimizer::partition_parameters() {
  const std::size_t ng = groups_.size();
  partition_.assign(static_cast<std::size_t>(world_size_), std::vector<std::vector<Tensor>>(ng));
  owner_.assign(all_params_.size(), -1);
  // Weights are whole numbers far below 2^53 (elements, or multiply-adds),
  // so the double sums are exact and every rank gets the same partition.
  const std::vector<double> weight = partition_weights();
  std::vector<double> sizes(static_cast<std::size_t>(world_size_), 0.0);
  for (std::size_t g = 0; g < ng; ++g) {
    std::vector<Tensor> sorted = groups_[g].params;
    auto w = [&](const Tensor& p) { return weight[static_cast<std::size_t>(index_of_.at(p.key()))]; };
    std::stable_sort(sorted.begin(), sorted.end(), [&](const Tensor& a, const Tensor& b) { return w(a) > w(b); });
    for (const auto& p : sorted) {
      std::size_t r = 0;
      for (std::size_t k = 1; k < sizes.size(); ++k)
        if (sizes[k] < sizes[r]) r = k;
      partition_[r][g].push_back(p);
      sizes[r] += w(p);
      owner_[static_cast<std::size_t>(index_of_.at(p.key()))] = static_cast<int>(r);
    }
  }
}

std::vector<double> ZeroRedundancyOptimizer::partition_weights() const {
  std::vector<double> out(all_params_.size(), 0.0);
  for (const auto& g : groups_)
    for (const auto& p : g.params) {
      const auto i = static_cast<std::size_t>(index_of_.at(p.key()));
      out[i] = partition_weight_ == ZeroPartitionWeight::step_cost ? std::floor(g.options->step_cost(p.shape()))
                                                                    : static_cast<double>(p.numel());
    }
  return out;
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizer::local_groups(std::size_t first_group) const {
  std::vector<OptimizerParamGroup> out;
  for (std::size_t g = first_group; g < groups_.size(); ++g)
    out.emplace_back(partition_[static_cast<std::size_t>(rank_)][g], groups_[g].options->clone());
  return out;
}

std::vector<bool> ZeroRedundancyOptimizer::trainable_mask() const {
  std::vector<bool> m;
  m.reserve(all_params_.size());
  for (const auto& p : all_params_) m.push_back(p.requires_grad());
  return m;
}

void ZeroRedundancyOptimizer::build_buckets() {
  // Kinds (device, dtype) in order of first appearance over ranks, groups, params.
  std::vector<std::pair<Device, DType>> kinds;
  auto kind_of = [&](const Tensor& p) -> std::size_t {
    for (std::size_t k = 0; k < kinds.size(); ++k)
      if (kinds[k].first == p.device() && kinds[k].second == p.dtype()) return k;
    kinds.emplace_back(p.device(), p.dtype());
    return kinds.size() - 1;
  };
  std::vector<std::vector<std::vector<Tensor>>> per(static_cast<std::size_t>(world_size_));  // [rank][kind]
  for (std::size_t r = 0; r < per.size(); ++r)
    for (const auto& g : partition_[r])
      for (const auto& p : g) {
        const std::size_t k = kind_of(p);
        if (per[r].size() <= k) per[r].resize(k + 1);
        per[r][k].push_back(p);
      }
  buckets_.assign(kinds.size(), std::vector<Tensor>(static_cast<std::size_t>(world_size_)));
  for (std::size_t r = 0; r < per.size(); ++r) {
    per[r].resize(kinds.size());
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      std::int64_t total = 0;
      for (const auto& p : per[r][k]) {
        if (p.requires_grad()) total += p.numel();
        else repoint(p, p.clone());  // frozen: own storage, outside any bucket
      }
      if (total == 0) {
        buckets_[k][r] = Tensor::zeros({1}, kinds[k].second, kinds[k].first);
        continue;
      }
      // Host-memory redundancy: this rank's bucket is in its shared segment.
      Tensor bucket = (!keeps_.empty() && static_cast<int>(r) == rank_)
                          ? keeps_.back()->bucket(k)
                          : Tensor::empty({total}, kinds[k].second, kinds[k].first);
      std::int64_t off = 0;
      for (const auto& p : per[r][k]) {
        if (!p.requires_grad()) continue;
        const std::int64_t n = p.numel();
        Tensor slice = bucket.flat_slice(off, n);
        slice.copy_(p);
        repoint(p, slice.view(p.shape()));
        off += n;
      }
      buckets_[k][r] = std::move(bucket);
    }
  }
}


}  // namespace dopt::optim
