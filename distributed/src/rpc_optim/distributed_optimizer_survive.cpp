// DistributedOptimizer with redundancy, the trainer's side: the numbered step,
// the membership agreement and the takeover of a lost owner's parameters by
// its buddy (distributed_optimizer.hpp, "Redundancy"; docs/fault-tolerance-optimizers.md).
#include <algorithm>
#include <set>
#include <tuple>

#include "distributed_optimizer_detail.hpp"
#include "survive/survive_util.hpp"
#include "dopt/actors/rpc_membership.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"

namespace dopt::optim {

namespace {

ZeroRecovery as_zero(const OwnerRecovery& r) {
  ZeroRecovery z;
  for (const auto& w : r.lost) z.lost.push_back(w.rank);
  z.step = r.step;
  z.step_completed = r.step_completed;
  for (const auto& w : r.joined) z.joined.push_back(w.rank);
  return z;
}

std::string indices_str(const std::vector<std::size_t>& v) {
  std::string s;
  for (auto i : v) s += (s.empty() ? "" : ", ") + std::to_string(i);
  return s;
}

std::string workers_str(const std::vector<rpc::WorkerInfo>& v) {
  std::string s;
  for (const auto& w : v) s += (s.empty() ? "" : ", ") + detail::owner_name(w);
  return s;
}

void merge(OwnerRecovery& into, const OwnerRecovery& r) {
  into.lost.insert(into.lost.end(), r.lost.begin(), r.lost.end());
  into.moved.insert(into.moved.end(), r.moved.begin(), r.moved.end());
  into.needs_gradient = r.needs_gradient;
  into.epoch = r.epoch;
}

}  // namespace

OwnersChangedError::OwnersChangedError(std::string op, std::string what, OwnerRecovery r, std::optional<int> rank)
    : MembershipChangedError(std::move(op), std::move(what), as_zero(r), rank), owner_recovery_(std::move(r)) {}

template <class... A>
std::vector<std::exception_ptr> DistributedOptimizer::fan_out_each(const std::string& method, const A&... args) const {
  rpc::Fn fn(method);
  fn.timeout = options_.timeout;
  fn.retries = options_.retries;
  std::vector<Future<void>> fs;
  for (const auto& o : owners_) fs.push_back(o.local.rpc_async<void>(fn, args...));
  std::vector<std::exception_ptr> out;
  for (auto& f : fs) {
    f.wait();
    out.push_back(f.exception());
  }
  return out;
}

void DistributedOptimizer::step_redundant(const rpc::GradContext& ctx) {
  const char* op = "DistributedOptimizer.step";
  OwnerRecovery total;
  bool recovered = false;
  for (std::size_t attempt = 0;; ++attempt) {
    // A deposit to a lost owner failed: the step below fails on that owner
    // too (or it was recovered from already and its gradients deposited again).
    try {
      ctx.deposits_done().get();
    } catch (const PeerLostError&) {
    }
    const auto errors = fan_out_each("dopt.optim.step_r", ctx.id(), epoch_, steps_);
    bool lost = false, other = false;
    for (const auto& e : errors)
      if (e) (detail::is_peer_lost(e) ? lost : other) = true;
    if (!lost && !other) break;
    if (other || attempt > owners_.size() + 1) {
      std::vector<rpc::WorkerInfo> who;
      for (const auto& o : owners_) who.push_back(agent_.worker_info(o.rank));
      std::rethrow_exception(detail::joined_error(errors, who, op, agent_.rank(), true));
    }
    OwnerRecovery r = recover_owners(true, ctx.id());
    merge(total, r);
    recovered = true;
    if (!r.needs_gradient.empty()) {
      total.context = ctx.id();
      total.step = steps_;
      total.step_completed = false;
      if (options_.on_membership_change) {
        // The callback deposits the missing gradients; the step is redone below.
        options_.on_membership_change(total);
        total.needs_gradient.clear();
        continue;
      }
      throw OwnersChangedError(
          op,
          "owner(s) " + workers_str(total.lost) + " lost; their parameters were taken over by their buddies, but the "
              "gradients of parameters " + indices_str(total.needs_gradient) +
              " (indices into parameters()) for the step in flight went with them: deposit them again on "
              "parameters() into the same context and call step() again (the owners that applied it skip it)",
          total, agent_.rank());
    }
  }
  ++steps_;
  if (!recovered) return;
  total.context = ctx.id();
  total.step = steps_;
  total.step_completed = true;
  report(op, std::move(total));
}

void DistributedOptimizer::report(const char* op, OwnerRecovery r) {
  r.step = steps_;
  if (options_.on_membership_change) {
    options_.on_membership_change(r);
    return;
  }
  std::string what = "owner(s) " + workers_str(r.lost) + " lost; their parameters (" + indices_str(r.moved) +
                     ", indices into parameters()) were taken over by their buddies";
  what += r.step_completed ? "; the step in flight was completed" : "; the call was completed";
  throw OwnersChangedError(op, what, std::move(r), agent_.rank());
}

void DistributedOptimizer::with_recovery(const char* op, const std::function<void()>& call,
                                         const std::function<void()>& after) {
  if (options_.redundancy <= 0) {
    call();
    if (after) after();
    return;
  }
  OwnerRecovery total;
  bool recovered = false;
  for (std::size_t attempt = 0;; ++attempt) {
    try {
      call();
      break;
    } catch (const PeerLostError&) {
      if (attempt > owners_.size() + 1) throw;
      merge(total, recover_owners(false, 0));
      recovered = true;
    }
  }
  if (after) after();
  if (recovered) report(op, std::move(total));
}

OwnerRecovery DistributedOptimizer::recover() {
  if (options_.redundancy <= 0)
    throw StateError("DistributedOptimizer.recover",
                     "this DistributedOptimizer has no redundancy (DistributedOptimizerOptions::redundancy = 0): a "
                     "lost owner's state is gone; fall back to the last checkpoint",
                     agent_.rank());
  OwnerRecovery r = recover_owners(false, 0);
  r.step = steps_;
  return r;
}

OwnerRecovery DistributedOptimizer::recover_owners(bool in_step, std::uint64_t context,
                                                   const std::vector<int>& joining) {
  const char* op = "DistributedOptimizer.recover";
  rpc::MembershipOptions mo;
  mo.timeout = options_.timeout;
  rpc::Fn steps_fn("dopt.optim.mirror_steps");
  steps_fn.timeout = options_.timeout;
  rpc::Fn promote_fn("dopt.optim.mirror_promote");
  promote_fn.timeout = options_.timeout;
  OwnerRecovery out;
  out.context = context;
  for (std::size_t round = 0;; ++round) {
    // 1. The trainer, the owners and the buddies agree on who is gone.
    std::set<int> members{agent_.rank()};
    for (const auto& o : owners_) {
      members.insert(o.rank);
      for (const auto& m : o.mirrors) members.insert(m.rank);
    }
    members.insert(joining.begin(), joining.end());
    for (int r : lost_) members.erase(r);
    const rpc::Membership m = rpc::agree_membership(agent_, line_, {members.begin(), members.end()}, mo);
    epoch_ = m.epoch;
    for (int r : m.lost)
      if (std::find(lost_.begin(), lost_.end(), r) == lost_.end()) {
        lost_.push_back(r);
        out.lost.push_back(agent_.worker_info(r));
      }
    // Every worker lost so far: an earlier round of this recovery may have
    // left an owner on one (its buddy was lost while taking over).
    const std::set<int> gone(lost_.begin(), lost_.end());
    out.epoch = epoch_;
    // 2. Copies on lost workers are gone; owners on lost workers need a buddy.
    std::vector<std::size_t> dead;
    for (std::size_t i = 0; i < owners_.size(); ++i) {
      auto& o = owners_[i];
      o.mirrors.erase(std::remove_if(o.mirrors.begin(), o.mirrors.end(), [&](const Mirror& x) { return gone.count(x.rank) > 0; }),
                      o.mirrors.end());
      if (gone.count(o.rank)) dead.push_back(i);
    }
    std::string gone_msg;
    for (auto i : dead)
      if (owners_[i].mirrors.empty())
        gone_msg += std::string(gone_msg.empty() ? "" : "; ") + "parameters " + indices_str(owners_[i].params) +
                    " (indices into parameters()) and their optimizer state, held by " +
                    detail::owner_name(agent_.worker_info(owners_[i].rank));
    if (!gone_msg.empty())
      throw OwnerStateLostError(
          op, "the state of " + gone_msg + " is gone: the owner and all its buddies were lost (redundancy " +
                  std::to_string(options_.redundancy) + ", lost: " + workers_str(out.lost) +
                  "). Fall back to the last checkpoint: restart the owners from the model's checkpoint and build a "
                  "new DistributedOptimizer over them",
          agent_.rank());
    // 3. Each lost owner's buddy that stepped furthest takes its parameters over.
    bool again = false;
    for (auto i : dead) {
      auto& o = owners_[i];
      std::vector<Future<std::int64_t>> fs;
      for (const auto& x : o.mirrors) fs.push_back(x.ref.rpc_async<std::int64_t>(steps_fn));
      std::vector<std::int64_t> steps;
      try {
        for (auto& f : fs) steps.push_back(f.get());
      } catch (const PeerLostError&) {
        again = true;  // a buddy lost meanwhile: agree again
        break;
      }
      const auto best = static_cast<std::size_t>(std::max_element(steps.begin(), steps.end()) - steps.begin());
      const std::int64_t at = steps[best];
      if (at != steps_ && at != steps_ + 1)
        throw StateError(op, "the copy of " + detail::owner_name(agent_.worker_info(o.rank)) + "'s parameters on " +
                                 detail::owner_name(agent_.worker_info(o.mirrors[best].rank)) + " has applied " +
                                 std::to_string(at) + " steps; this optimizer has completed " +
                                 std::to_string(steps_),
                         agent_.rank());
      // Copies that lag behind the best one missed a step whose gradients
      // are gone: they are dropped.
      std::vector<Mirror> keep;
      std::vector<rpc::RRef<OwnerMirror>> keep_refs;
      for (std::size_t j = 0; j < o.mirrors.size(); ++j)
        if (j != best && steps[j] == at) {
          keep.push_back(o.mirrors[j]);
          keep_refs.push_back(o.mirrors[j].ref);
        }
      std::tuple<rpc::RRef<OwnerOptimizer>, std::vector<rpc::RRef<Tensor>>, std::int64_t> t;
      try {
        t = o.mirrors[best].ref.rpc_sync<decltype(t)>(promote_fn, epoch_, keep_refs);
      } catch (const PeerLostError&) {
        again = true;
        break;
      }
      auto& [local, ps, promoted_steps] = t;
      if (ps.size() != o.params.size())
        throw StateError(op, "the copy returned " + std::to_string(ps.size()) + " parameters, expected " +
                                 std::to_string(o.params.size()), agent_.rank());
      o.rank = o.mirrors[best].rank;
      o.local = local;
      o.mirrors = keep;
      for (std::size_t k = 0; k < ps.size(); ++k) {
        params_[o.params[k]] = ps[k];
        out.moved.push_back(o.params[k]);
        if (in_step && promoted_steps == steps_) out.needs_gradient.push_back(o.params[k]);
      }
      (void)promoted_steps;
    }
    if (again) continue;
    std::sort(out.moved.begin(), out.moved.end());
    std::sort(out.needs_gradient.begin(), out.needs_gradient.end());
    return out;
  }
}

}  // namespace dopt::optim
