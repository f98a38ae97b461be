// ZeroRedundancyOptimizer: step() (the local step, the buddies' copies, the
// parameter broadcasts) and zero_grad().
#include <exception>

#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/notice.hpp"
#include "zero_host_memory.hpp"
#include "zero_internal.hpp"
#include "zero_overlap_internal.hpp"

namespace dopt::optim {

using zero_detail::kName;

void ZeroRedundancyOptimizer::sync_to_local() {
  auto& local = optim_->param_groups();
  for (std::size_t g = 0; g < groups_.size() && g < local.size(); ++g)
    local[g].options = groups_[g].options->clone();
}

void ZeroRedundancyOptimizer::sync_from_local() {
  const auto& local = optim_->param_groups();
  for (std::size_t g = 0; g < groups_.size() && g < local.size(); ++g)
    groups_[g].options = local[g].options->clone();
}

void ZeroRedundancyOptimizer::sync_params(const std::function<void()>& meanwhile) {
  if (reads_parameters_from_segments()) {  // never with a `meanwhile` (replay only)
    read_params_from_keeps();
    return;
  }
  std::vector<Future<void>> works;
  std::exception_ptr first;
  auto post = [&](Future<void> f) {
    works.push_back(std::move(f));
    if (probe_) probe_("broadcast", steps_, static_cast<int>(works.size()) - 1);
  };
  try {
    for (int r = 0; r < world_size_; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (bucket_view_) {
        for (auto& kind : buckets_) post(group_.broadcast_async(kind[ur], r));
        // A frozen parameter is in no bucket, but its owner still steps it
        // when it has a gradient: its value goes out too, or the ranks'
        // copies part (torch 1.13 lets them part; torch-differences.md).
        std::vector<Tensor> frozen;
        bool cpu = true;
        for (const auto& g : partition_[ur])
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
      for (const auto& g : partition_[ur])
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
    first = std::current_exception();
  }
  std::exception_ptr during;
  if (meanwhile) {  // once, whatever the posting did (a recovery may need what it does)
    try {
      meanwhile();
    } catch (...) {
      during = std::current_exception();
    }
  }
  for (auto& w : works) wait_keeping_first_error(w, first);
  if (during) std::rethrow_exception(during);  // before a lost peer: the recovery would need its work
  if (first) std::rethrow_exception(first);
}

std::optional<double> ZeroRedundancyOptimizer::step(const Optimizer::LossClosure& closure) {
  if (overlap_) {
    if (closure)
      throw ValueError(std::string(kName) + ".step",
                       "a closure cannot be used with overlap_with_ddp=true (the steps run in the comm hook)",
                       rank_);
    overlap_->wait_step();
    return std::nullopt;
  }
  if (redundancy_ > 0 && closure)
    throw ValueError(std::string(kName) + ".step",
                     "a closure cannot be used with redundancy (the buddies step their copies with the gradients "
                     "step() is called with)", rank_);
  Future<void> notify = Join::notify_join_context(*this);
  const auto mask = trainable_mask();
  if (mask != trainable_) {
    if (bucket_view_) {
      notice(std::string(kName) + " [rank " + std::to_string(rank_) +
             "]: the trainable parameters changed; rebuilding the parameter buckets");
      if (host_memory()) {
        share_keeps_anew();
      } else {
        build_buckets();
      }
    }
    trainable_ = mask;
  }
  if (probe_) probe_("begin", steps_, 0);
  sync_to_local();
  std::optional<double> loss = optim_->step(closure);
  if (redundancy_ > 0 && !replays()) step_buddy_copies();
  sync_from_local();
  if (probe_) probe_("computed", steps_, 0);
  if (redundancy_ == 0) {
    sync_params();
    notify.get();
    ++steps_;
    return loss;
  }
  // Replay: the buddies save this step's gradients while the broadcasts are
  // in flight (the broadcasts write parameters, not gradients). Every
  // snapshot_interval-th step ends with a snapshot of each owner's state at
  // its buddies (posted now, received after the broadcasts) instead: its
  // gradients are saved only where the snapshot does not arrive (then the
  // copy replays from the older one), or when the step is lost before.
  const bool snapshot = replays() && (steps_ + 1) % snapshot_interval_ == 0;
  std::vector<Future<void>> snapshot_sends;
  ZeroRecovery rec;
  bool saved = !replays();
  try {
    if (snapshot) snapshot_sends = post_snapshot();
    std::function<void()> save;
    if (replays() && !snapshot)
      save = [&] {
        save_buddy_grads();
        saved = true;
      };
    sync_params(save);
    notify.get();
    if (snapshot && probe_) probe_("snapshot", steps_, 0);
    if (snapshot) {
      saved = true;  // from here on by finish_snapshot, copy by copy
      finish_snapshot(snapshot_sends);
    }
    ++steps_;
    return loss;
  } catch (const PeerLostError&) {
    snapshot_sends.clear();  // on the old group; the recovery snapshots every copy anew
    if (!saved) save_buddy_grads();  // lost before they were saved (or before a snapshot)
    rec = recover_from_loss(/*in_step=*/true);
  }
  if (!on_membership_change_)
    throw MembershipChangedError(std::string(kName) + ".step",
                                 "recovered from the loss of rank(s) of the group; the step was completed, " +
                                     std::to_string(rec.group.size()) + " rank(s) continue",
                                 rec, rank_);
  on_membership_change_(rec);
  return loss;
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (const auto& p : all_params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else g.zero_();
  }
}


}  // namespace dopt::optim
