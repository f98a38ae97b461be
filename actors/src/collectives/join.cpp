#include "dopt/runtime/notice.hpp"
#include "dopt/actors/join.hpp"

#include <cstdio>
#include <unordered_set>

namespace dopt {

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options) {
  const char* op = "Join";
  if (joinables_.empty()) throw ValueError(op, "The join context manager requires at least one joinable");
  std::unordered_set<const Joinable*> seen;
  for (std::size_t i = 0; i < joinables_.size(); ++i) {
    if (!joinables_[i]) throw ValueError(op, "joinable " + std::to_string(i) + " is null");
    if (!seen.insert(joinables_[i]).second)
      throw ValueError(op, "joinable " + std::to_string(i) + " is listed twice");
  }
  group_ = joinables_.front()->join_process_group();
  if (!group_.valid()) throw ValueError(op, "the first joinable has no valid process group");
  for (std::size_t i = 1; i < joinables_.size(); ++i) {
    ProcessGroup g = joinables_[i]->join_process_group();
    if (!g.valid() || g.id() != group_.id())
      throw ValueError(op, "Using join context manager with multiple process groups (joinable " +
                               std::to_string(i) + " is on another group than joinable 0)",
                       group_.rank());
  }
  device_ = joinables_.front()->join_device();
  for (auto* j : joinables_) hooks_.push_back(j->join_hook());
  for (std::size_t i = 0; i < joinables_.size(); ++i) {
    JoinConfig& c = joinables_[i]->join_config_;
    c.enable = options_.enable;
    c.throw_on_early_termination = options_.throw_on_early_termination;
    c.is_first_joinable = (i == 0);
    c.joined = false;
  }
}

Join::~Join() { disable(); }

void Join::disable() noexcept {
  for (auto* j : joinables_) j->join_config_ = JoinConfig{};
}

void Join::finish() {
  if (finished_) throw StateError("Join.finish", "finish() was already called", group_.rank());
  finished_ = true;
  if (!options_.enable) {
    disable();
    return;
  }
  // This rank has joined: its own notify calls (from main hooks re-entering
  // the joinable's work) must not post extra all-reduces.
  joinables_.front()->join_config_.joined = true;
  bool is_last_joiner = true;
  bool warned = false;
  try {
    for (;;) {
      if (iterations_ > 1000 && !warned) {
        warned = true;
        notice("Join [rank " + std::to_string(group_.rank()) +
               "]: more than 1000 shadow iterations after this rank joined (uneven inputs that large may be "
               "an error)");
      }
      Tensor n = Tensor::zeros({1}, DType::float32, device_);
      group_.all_reduce(n, ReduceOp::sum);
      if (n.to(Device::cpu()).item() == 0.0) break;
      if (options_.throw_on_early_termination) {
        Tensor ones = Tensor::full({1}, 1.0, DType::float32, device_);
        group_.all_reduce(ones, ReduceOp::sum);
        throw EarlyTerminationError("Join", "Rank " + std::to_string(group_.rank()) + " exhausted all inputs.",
                                    group_.rank());
      }
      for (auto& h : hooks_) h->main_hook();
      is_last_joiner = false;
      ++iterations_;
    }
    for (auto& h : hooks_) h->post_hook(is_last_joiner);
  } catch (...) {
    disable();
    throw;
  }
  disable();
}

Future<void> Join::notify_join_context(Joinable& joinable) {
  const JoinConfig& c = joinable.join_config_;
  if (!c.enable || !c.is_first_joinable || c.joined) return make_ready_future();
  ProcessGroup g = joinable.join_process_group();
  const Device d = joinable.join_device();
  Tensor ones = Tensor::full({1}, 1.0, DType::float32, d);
  Future<void> work = g.all_reduce_async(ones, ReduceOp::sum);
  if (c.throw_on_early_termination) {
    Tensor z = Tensor::zeros({1}, DType::float32, d);
    g.all_reduce(z, ReduceOp::sum);
    if (z.to(Device::cpu()).item() != 0.0) {
      work.wait();
      throw EarlyTerminationError("Join",
                                  "Detected at least one rank that exhausted inputs. Throwing across all ranks.",
                                  g.rank());
    }
  }
  return work;
}

}  // namespace dopt
