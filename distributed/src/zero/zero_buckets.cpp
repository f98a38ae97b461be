// Buckets (zero_buckets.hpp): the flat per-rank buffers of
// parameters_as_bucket_view.
#include "zero_buckets.hpp"

namespace dopt::optim::zero_detail {

std::size_t Buckets::kind_index(std::vector<Kind>& kinds, const Tensor& p) {
  for (std::size_t k = 0; k < kinds.size(); ++k)
    if (kinds[k].first == p.device() && kinds[k].second == p.dtype()) return k;
  kinds.emplace_back(p.device(), p.dtype());
  return kinds.size() - 1;
}

std::vector<Kind> Buckets::kinds(const Partition& part) {
  std::vector<Kind> kinds;
  for (const auto& rank_groups : part.by_rank())
    for (const auto& g : rank_groups)
      for (const auto& p : g) kind_index(kinds, p);
  return kinds;
}

namespace {

/// One rank's bucket of one kind over `ps` (trainable ones, in order):
/// `bucket` (undefined: fresh memory) filled and the parameters re-pointed.
Tensor fill(const std::vector<Tensor>& ps, const Kind& kind, Tensor bucket, const Repoint& repoint) {
  std::int64_t total = 0;
  for (const auto& p : ps) total += p.numel();
  if (total == 0) return Tensor::zeros({1}, kind.second, kind.first);
  if (!bucket.defined()) bucket = Tensor::empty({total}, kind.second, kind.first);
  std::int64_t off = 0;
  for (const auto& p : ps) {
    const std::int64_t n = p.numel();
    Tensor slice = bucket.flat_slice(off, n);
    slice.copy_(p);
    repoint(p, slice.view(p.shape()));
    off += n;
  }
  return bucket;
}

}  // namespace

void Buckets::build(const Partition& part, int rank, const Repoint& repoint, const OwnBucket& own) {
  // Kinds (device, dtype) in order of first appearance over ranks, groups, params.
  std::vector<Kind> kinds;
  const int world = part.world();
  std::vector<std::vector<std::vector<Tensor>>> per(static_cast<std::size_t>(world));  // [rank][kind]
  for (std::size_t r = 0; r < per.size(); ++r)
    for (const auto& g : part.by_rank()[r])
      for (const auto& p : g) {
        const std::size_t k = kind_index(kinds, p);
        if (per[r].size() <= k) per[r].resize(k + 1);
        per[r][k].push_back(p);
      }
  rows_.assign(kinds.size(), std::vector<Tensor>(static_cast<std::size_t>(world)));
  for (std::size_t r = 0; r < per.size(); ++r) {
    per[r].resize(kinds.size());
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      std::vector<Tensor> trainable;
      for (const auto& p : per[r][k]) {
        if (p.requires_grad()) trainable.push_back(p);
        else repoint(p, p.clone());  // frozen: own storage, outside any bucket
      }
      // Host-memory redundancy: this rank's bucket is in its shared segment.
      const bool mine = static_cast<int>(r) == rank && own && !trainable.empty();
      rows_[k][r] = fill(trainable, kinds[k], mine ? own(k) : Tensor(), repoint);
    }
  }
}

void Buckets::keep_and_add(const std::vector<int>& new_rank, int nw, const std::vector<Kind>& kinds,
                           const std::vector<std::vector<std::vector<Tensor>>>& moved, int rank,
                           const Repoint& repoint, const OwnBucket& own) {
  // The survivors' buckets stay (renumbered): what each kept is still in its
  // bucket, in order. The parameters that came from lost ranks go into one
  // more row of buckets (one per kind, one flat buffer per rank, in
  // partition order), so only they are copied.
  std::vector<std::vector<Tensor>> rows;
  for (const auto& row : rows_) {
    std::vector<Tensor> kept(static_cast<std::size_t>(nw));
    for (std::size_t o = 0; o < new_rank.size(); ++o)
      if (new_rank[o] >= 0) kept[static_cast<std::size_t>(new_rank[o])] = row[o];
    rows.push_back(std::move(kept));
  }
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    std::vector<Tensor> row(static_cast<std::size_t>(nw));
    for (int r = 0; r < nw; ++r) {
      const auto& mr = moved[static_cast<std::size_t>(r)];
      const std::vector<Tensor> none;
      const auto& ps = k < mr.size() ? mr[k] : none;
      std::int64_t total = 0;
      for (const auto& p : ps) total += p.numel();
      const bool mine = r == rank && own && total > 0;
      row[static_cast<std::size_t>(r)] = fill(ps, kinds[k], mine ? own(k) : Tensor(), repoint);
    }
    rows.push_back(std::move(row));
  }
  rows_ = std::move(rows);
}

}  // namespace dopt::optim::zero_detail
