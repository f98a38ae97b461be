// ShardSync (zero_shard_sync.hpp): every shard from its owner after a step.
#include "zero_shard_sync.hpp"

#include <exception>
#include <vector>

namespace dopt::optim::zero_detail {

Future<void> ShardSync::start(const std::function<void(int)>& posted) {
  std::vector<Future<void>> works;
  std::exception_ptr posting;
  auto post = [&](Future<void> f) {
    works.push_back(std::move(f));
    if (posted) posted(static_cast<int>(works.size()) - 1);
  };
  // Without the bucket view only owners post (in rank order): a rank that
  // owns nothing has nothing to send, and nobody looks at it (thousands of
  // simulated ranks would otherwise each look at every rank).
  std::vector<int> ranks;
  if (bucket_view_) {
    ranks.resize(static_cast<std::size_t>(part_.world()));
    for (int r = 0; r < part_.world(); ++r) ranks[static_cast<std::size_t>(r)] = r;
  } else {
    ranks = part_.owning_ranks();
  }
  try {
    for (const int r : ranks) {
      if (bucket_view_) {
        for (const auto& kind : buckets_.rows()) post(group_.broadcast_async(kind[static_cast<std::size_t>(r)], r));
        // A frozen parameter is in no bucket, but its owner still steps it
        // when it has a gradient: its value goes out too, or the ranks'
        // copies part (torch 1.13 lets them part; torch-differences.md).
        std::vector<Tensor> frozen;
        bool cpu = true;
        for (const auto& g : part_.of(r))
          for (const auto& p : g)
            if (!p.requires_grad()) {
              frozen.push_back(p);
              cpu = cpu && p.device().is_cpu();
            }
        if (cpu && !frozen.empty()) post(group_.broadcast_coalesced_async(frozen, r));
        if (!cpu)
          for (const auto& p : frozen) post(group_.broadcast_async(p, r));
        continue;
      }
      // One call for all of rank r's parameters (on the shared-memory plane
      // without a flat copy); device tensors go one by one to their backend.
      std::vector<Tensor> mine;
      bool cpu = true;
      for (const auto& g : part_.of(r))
        for (const auto& p : g) {
          mine.push_back(p);
          cpu = cpu && p.device().is_cpu();
        }
      if (cpu) {
        if (!mine.empty()) post(group_.broadcast_coalesced_async(mine, r));
      } else {
        for (const auto& p : mine) post(group_.broadcast_async(p, r));
      }
    }
  } catch (...) {
    posting = std::current_exception();
  }
  Future<void> all = when_all(works);
  if (!posting) return all;
  // The posting's error comes first, once what was posted has completed.
  return all.then([posting](const Future<void>&) { std::rethrow_exception(posting); });
}

void ShardSync::run(const std::function<void(int)>& posted, const std::function<void()>& meanwhile) {
  Future<void> all = start(posted);
  std::exception_ptr during;
  if (meanwhile) {  // once, whatever the posting did (a recovery may need what it does)
    try {
      meanwhile();
    } catch (...) {
      during = std::current_exception();
    }
  }
  all.wait();
  if (during) std::rethrow_exception(during);  // before a lost peer: the recovery would need its work
  all.get();
}

}  // namespace dopt::optim::zero_detail
