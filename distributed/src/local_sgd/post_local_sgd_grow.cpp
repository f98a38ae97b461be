// post_local_sgd_catch_up (post_local_sgd.hpp, "growing back"): the members
// of a grown group go on with their PostLocalSGDOptimizer over it; each
// newcomer's becomes a copy of the lowest-ranked member's (design in
// docs/growing-back.md). Rank thread; collective over the
// grown group, point to point.
#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "dopt/actors/internal/call_label.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/optim/internal/state_load.hpp"
#include "dopt/runtime/safetensors.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "local_sgd/averager_agreement.hpp"

namespace dopt::optim {
namespace {

constexpr const char* kCatchUp = "post_local_sgd_catch_up";
/// The tag of the catch-up's sends (the state dict, then the parameters).
constexpr int kTag = 0x504C;
/// The metadata keys of the counters that travel with the state dict.
constexpr const char* kStepsTakenKey = "dopt.catch_up.steps_taken";
constexpr const char* kStepsSkippedKey = "dopt.catch_up.steps_skipped";

bool joined(const GrowResult& grown, int group_rank) {
  return std::binary_search(grown.joined.begin(), grown.joined.end(), grown.group.global_rank(group_rank));
}

/// The group rank in grown.group of its lowest-ranked member (who sends to the newcomers).
int sender_of(const GrowResult& grown) {
  int r = 0;
  while (r < grown.group.size() && joined(grown, r)) ++r;
  return r;
}

/// A member's averager runs over the group that grew: its ranks are grown.new_rank's.
void check_member_group(const ProcessGroup& old, const GrowResult& grown, int rank) {
  bool same = old.valid() && static_cast<int>(grown.new_rank.size()) == old.size();
  for (int r = 0; same && r < old.size(); ++r)
    same = grown.group.global_rank(grown.new_rank[static_cast<std::size_t>(r)]) == old.global_rank(r);
  if (!same)
    throw ValueError(kCatchUp, "a member's averager must run over the group that grew (the group grow() was "
                               "called on)", rank);
}

/// The serialized state to group rank dst, posted: its length (int64), then its bytes (never empty).
void post_bytes(ProcessGroup& g, const std::string& bytes, int dst, std::vector<Future<void>>& sends) {
  Tensor body = Tensor::empty({static_cast<std::int64_t>(bytes.size())}, DType::uint8);
  std::memcpy(body.data_ptr(), bytes.data(), bytes.size());
  sends.push_back(g.send_async(Tensor::full({1}, static_cast<double>(bytes.size()), DType::int64), dst, kTag));
  sends.push_back(g.send_async(body, dst, kTag));
}

std::string take_bytes(ProcessGroup& g, int src) {
  Tensor length = Tensor::zeros({1}, DType::int64);
  g.recv(length, src, kTag);
  Tensor body = Tensor::empty({length.data<std::int64_t>()[0]}, DType::uint8);
  g.recv(body, src, kTag);
  return std::string(static_cast<const char*>(body.data_ptr()), static_cast<std::size_t>(body.numel()));
}

std::vector<Tensor> all_params(const PostLocalSGDOptimizer& opt) {
  std::vector<Tensor> out;
  for (const auto& group : opt.param_groups()) out.insert(out.end(), group.params.begin(), group.params.end());
  return out;
}

}  // namespace

void post_local_sgd_catch_up(PostLocalSGDOptimizer& opt, const GrowResult& grown) {
  dopt::detail::CallScope call_scope("post_local_sgd_catch_up()");
  ProcessGroup g = grown.group;
  if (!g.valid() || !g.is_member())
    throw ValueError(kCatchUp, "grown.group is invalid or does not hold this rank", opt.averager_->process_group().rank());
  const int me = g.rank();
  const bool newcomer = joined(grown, me);
  opt.settle(kCatchUp);
  if (newcomer && opt.averager_->process_group().id() != g.id())
    throw ValueError(kCatchUp, "a newcomer's averager must be built over grown.group", me);
  if (!newcomer) check_member_group(opt.averager_->process_group(), grown, me);
  // A periodic averager's period and warm-up must be the members' on the
  // newcomers (a hierarchical one's map and warm-up are compared where its
  // levels are made: the newcomer's constructor, the members'
  // take_grown_group; the same exchange, averager_agreement.hpp).
  if (const auto* p = dynamic_cast<const PeriodicModelAverager*>(opt.averager_.get()))
    detail::agree_averager_config(g, {detail::AveragerConfig::periodic, p->warmup_steps(), {{p->period(), 0}}},
                                  kCatchUp);
  // Every rank (the newcomers too) checks that its averager can go on over
  // the grown group before anything is sent.
  opt.averager_->take_grown_group(g, kCatchUp);
  const int from = sender_of(grown);
  std::vector<Future<void>> sends;
  std::exception_ptr first;
  try {
    if (me == from && !grown.joined.empty()) {
      StateDict sd = opt.state_dict();
      sd.metadata[kStepsTakenKey] = std::to_string(opt.steps_taken_);
      sd.metadata[kStepsSkippedKey] = std::to_string(opt.steps_skipped_);
      const SafetensorsFile file = state_dict_to_safetensors(sd);
      const std::string bytes = serialize_safetensors(file.tensors, file.metadata);
      for (int global : grown.joined) {
        const int r = g.group_rank(global);
        post_bytes(g, bytes, r, sends);
        for (const auto& p : all_params(opt)) sends.push_back(g.send_async(p, r, kTag));
      }
    }
    if (newcomer) {
      const std::string bytes = take_bytes(g, from);
      for (const auto& p : all_params(opt)) g.recv(p, from, kTag);
      const std::string what = "the state of group rank " + std::to_string(from);
      StateDict sd = state_dict_from_safetensors(parse_safetensors(bytes.data(), bytes.size(), what), what);
      const std::int64_t taken = detail::parse_count(sd.metadata[kStepsTakenKey], kCatchUp, "steps_taken");
      const std::int64_t skipped = detail::parse_count(sd.metadata[kStepsSkippedKey], kCatchUp, "steps_skipped");
      sd.metadata.erase(kStepsTakenKey);
      sd.metadata.erase(kStepsSkippedKey);
      opt.load_state_dict(sd);
      opt.steps_taken_ = taken;
      opt.steps_skipped_ = skipped;
    }
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& f : sends) wait_keeping_first_error(f, first);
  if (first) std::rethrow_exception(first);
  if (!newcomer && opt.on_membership_change_)  // a join (recovery.hpp)
    opt.on_membership_change_(join_record(grown, opt.steps_taken_ + opt.steps_skipped_));
}

}  // namespace dopt::optim
