// Partition (zero_partition.hpp): which rank owns which parameter.
#include "zero_partition.hpp"

#include <algorithm>

namespace dopt::optim::zero_detail {

Partition Partition::blank(std::size_t groups, std::size_t params, int world) {
  Partition out;
  out.world_ = world;
  out.none_.resize(groups);
  out.owner_.assign(params, -1);
  return out;
}

const std::vector<std::vector<Tensor>>& Partition::of(int r) const {
  const auto it = std::lower_bound(owning_.begin(), owning_.end(), r,
                                   [](const auto& part, int rank) { return part.first < rank; });
  return it != owning_.end() && it->first == r ? it->second : none_;
}

std::vector<int> Partition::owning_ranks() const {
  std::vector<int> out;
  out.reserve(owning_.size());
  for (const auto& part : owning_) out.push_back(part.first);
  return out;
}

const std::vector<std::vector<std::vector<Tensor>>>& Partition::by_rank() const {
  if (!by_rank_) {
    auto all = std::make_shared<std::vector<std::vector<std::vector<Tensor>>>>(static_cast<std::size_t>(world_), none_);
    for (const auto& [r, part] : owning_) (*all)[static_cast<std::size_t>(r)] = part;
    by_rank_ = std::move(all);
  }
  return *by_rank_;
}

Partition Partition::none(const ZeroParams& params, int world) {
  return blank(params.groups().size(), params.size(), world);
}

void Partition::assign(const Tensor& p, std::int64_t i, std::size_t g, int r) {
  auto it = std::lower_bound(owning_.begin(), owning_.end(), r,
                             [](const auto& part, int rank) { return part.first < rank; });
  if (it == owning_.end() || it->first != r) it = owning_.emplace(it, r, none_);
  it->second[g].push_back(p);
  owner_[static_cast<std::size_t>(i)] = r;
  by_rank_.reset();
}

Partition Partition::balanced(const ZeroParams& params, const std::vector<double>& weight, int world) {
  const std::size_t ng = params.groups().size();
  Partition out = blank(ng, params.size(), world);
  // Weights are whole numbers far below 2^53 (elements, or multiply-adds),
  // so the double sums are exact and every rank gets the same partition.
  std::vector<double> sizes(static_cast<std::size_t>(world), 0.0);
  for (std::size_t g = 0; g < ng; ++g) {
    std::vector<Tensor> sorted = params.groups()[g].params;
    auto w = [&](const Tensor& p) { return weight[static_cast<std::size_t>(params.index_of(p))]; };
    std::stable_sort(sorted.begin(), sorted.end(), [&](const Tensor& a, const Tensor& b) { return w(a) > w(b); });
    for (const auto& p : sorted) {
      std::size_t r = 0;
      for (std::size_t k = 1; k < sizes.size(); ++k)
        if (sizes[k] < sizes[r]) r = k;
      out.assign(p, params.index_of(p), g, static_cast<int>(r));
      sizes[r] += w(p);
    }
  }
  return out;
}

Partition Partition::keeping(const Partition& old, const std::vector<int>& new_rank, int nw,
                             const std::vector<double>& weight, const ZeroParams& params) {
  const std::size_t ng = old.none_.size();
  Partition out = blank(ng, weight.size(), nw);
  std::vector<double> sizes(static_cast<std::size_t>(nw), 0.0);
  auto w = [&](const Tensor& p) { return weight[static_cast<std::size_t>(params.index_of(p))]; };
  auto give = [&](const Tensor& p, std::size_t g, int r) {
    out.assign(p, params.index_of(p), g, r);
    sizes[static_cast<std::size_t>(r)] += w(p);
  };
  for (const auto& [o, part] : old.owning_)  // by old rank, as every old rank in turn
    if (new_rank[static_cast<std::size_t>(o)] >= 0)
      for (std::size_t g = 0; g < ng; ++g)
        for (const auto& p : part[g]) give(p, g, new_rank[static_cast<std::size_t>(o)]);
  for (std::size_t g = 0; g < ng; ++g) {
    std::vector<Tensor> lost;
    for (const auto& [o, part] : old.owning_)
      if (new_rank[static_cast<std::size_t>(o)] < 0) lost.insert(lost.end(), part[g].begin(), part[g].end());
    std::stable_sort(lost.begin(), lost.end(), [&](const Tensor& a, const Tensor& b) { return w(a) > w(b); });
    for (const auto& p : lost) {
      int r = 0;
      for (int k = 1; k < nw; ++k)
        if (sizes[static_cast<std::size_t>(k)] < sizes[static_cast<std::size_t>(r)]) r = k;
      give(p, g, r);
    }
  }
  return out;
}

std::vector<Tensor> Partition::shard(int r) const {
  std::vector<Tensor> out;
  for (const auto& g : of(r))
    for (const auto& p : g) out.push_back(p);
  return out;
}

std::vector<OptimizerParamGroup> Partition::local_groups(const ZeroParams& params, int r, std::size_t first) const {
  std::vector<OptimizerParamGroup> out;
  const auto& groups = params.groups();
  for (std::size_t g = first; g < groups.size(); ++g)
    out.emplace_back(of(r)[g], groups[g].options->clone());
  return out;
}

}  // namespace dopt::optim::zero_detail
