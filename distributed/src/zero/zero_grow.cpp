// zero_catch_up (zero.hpp, "growing back"): a ZeroRedundancyOptimizer over a
// grown group takes over the members' optimizer state, and its newcomers the
// parameters, hyperparameters and step count (design in
// docs/growing-back.md). Rank thread; collective over the
// grown group.
#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "dopt/distributed/zero.hpp"
#include "zero_core.hpp"
#include "zero_wire.hpp"

namespace dopt::optim {
namespace {

constexpr const char* kCatchUp = "zero_catch_up";
/// Tags of the catch-up's sends: the state descriptions and tensors, then what a newcomer gets.
constexpr int kStateTag = 0x4752;
constexpr int kNewcomerTag = 0x4753;

/// The double-valued hyperparameters of each group, in key order (what a newcomer is sent).
std::vector<double> numbers_of(const Hyperparams& h) {
  std::vector<double> out;
  for (const auto& [key, v] : h)
    if (const double* d = std::get_if<double>(&v)) out.push_back(*d);
  return out;
}

/// The members of grown.group (its ranks that were there before), as group ranks.
std::vector<int> members_of(const GrowResult& grown) {
  std::vector<int> out;
  for (int r = 0; r < grown.group.size(); ++r)
    if (!std::binary_search(grown.joined.begin(), grown.joined.end(), grown.group.global_rank(r))) out.push_back(r);
  return out;
}

/// The state a member moves: to each other rank of the grown group the state
/// of the parameters it owned in `before` and that rank keeps in z (posted,
/// the futures into sends); its own such state into `local`.
void post_state(ZeroCore& z, ZeroCore& before, ProcessGroup& g, const std::vector<std::vector<int>>& keepers,
                zero_detail::StateByParam& local, std::vector<Future<void>>& sends) {
  const int me = g.rank();
  const int was = before.group.rank();
  for (int r = 0; r < g.size(); ++r) {
    std::vector<zero_detail::Entry> entries;
    std::vector<Tensor> tensors;
    for (std::size_t i = 0; i < z.params.size(); ++i) {
      if (before.part.owner(i) != was) continue;
      const auto& ks = keepers[i];
      if (std::find(ks.begin(), ks.end(), r) == ks.end()) continue;
      auto it = before.optim->state().find(z.params.at(i).key());
      if (it == before.optim->state().end()) continue;  // not stepped yet: no state
      if (r == me) {
        local[it->first] = it->second;
        continue;
      }
      for (const auto& [key, t] : it->second) {
        if (!t.defined()) continue;
        entries.push_back(zero_detail::Entry{static_cast<std::int64_t>(i), key, t.dtype(), t.shape()});
        tensors.push_back(t);
      }
    }
    if (r == me) continue;
    zero_detail::post_string(g, zero_detail::describe(entries), r, kStateTag, sends);
    for (const auto& t : tensors) sends.push_back(g.send_async(t, r, kStateTag));
  }
}

/// What a rank receives of the state it keeps in z from every other member.
void take_state(ZeroCore& z, ProcessGroup& g, const std::vector<int>& members, zero_detail::StateByParam& local,
                std::vector<Future<void>>& recvs) {
  for (int m : members) {
    if (m == g.rank()) continue;
    for (const auto& e : zero_detail::parse(zero_detail::recv_string(g, m, kStateTag))) {
      const Tensor& p = z.params.at(static_cast<std::size_t>(e.index));
      Tensor into = Tensor::empty(e.shape, e.dtype, p.device());
      local[p.key()][e.key] = into;
      recvs.push_back(g.recv_async(into, m, kStateTag));
    }
  }
}

/// The lowest-ranked member to each newcomer: step count, hyperparameters (numbers), parameters.
void send_to_newcomers(ZeroCore& before, ProcessGroup& g, const GrowResult& grown, std::vector<Future<void>>& sends) {
  for (int newcomer : grown.joined) {
    const int r = g.group_rank(newcomer);
    sends.push_back(g.send_async(Tensor::full({1}, static_cast<double>(before.steps), DType::int64), r, kNewcomerTag));
    for (const auto& group : before.params.groups()) {
      const auto numbers = numbers_of(group.options->to_hyperparams());
      Tensor t = Tensor::zeros({static_cast<std::int64_t>(numbers.size())}, DType::float64);
      std::copy(numbers.begin(), numbers.end(), t.data<double>());
      sends.push_back(g.send_async(t, r, kNewcomerTag));
    }
    for (const auto& p : before.params.all()) sends.push_back(g.send_async(p, r, kNewcomerTag));
  }
}

void receive_as_newcomer(ZeroCore& z, ProcessGroup& g, int peer) {
  Tensor steps = Tensor::zeros({1}, DType::int64);
  g.recv(steps, peer, kNewcomerTag);
  z.steps = steps.data<std::int64_t>()[0];
  for (auto& group : z.params.groups()) {
    Hyperparams h = group.options->to_hyperparams();
    Tensor t = Tensor::zeros({static_cast<std::int64_t>(numbers_of(h).size())}, DType::float64);
    g.recv(t, peer, kNewcomerTag);
    const double* v = t.data<double>();
    for (auto& [key, value] : h)
      if (std::holds_alternative<double>(value)) value = *v++;
    group.options->set_hyperparams(h);
  }
  for (const auto& p : z.params.all()) g.recv(p, peer, kNewcomerTag);
}

}  // namespace

void zero_catch_up(ZeroRedundancyOptimizer& zero, ZeroRedundancyOptimizer* before, const GrowResult& grown) {
  ZeroCore& z = ZeroCoreAccess::core(zero);
  ProcessGroup g = grown.group;
  const int rank = z.rank;
  if (!g.valid() || !g.is_member() || z.group.id() != g.id())
    throw ValueError(kCatchUp, "zero must be constructed over grown.group (ZeroOptions::process_group)", rank);
  const bool newcomer =
      std::binary_search(grown.joined.begin(), grown.joined.end(), g.global_rank(g.rank()));
  if (newcomer && before)
    throw ValueError(kCatchUp, "a newcomer has no optimizer from before the group grew: pass before = nullptr", rank);
  if (!newcomer && !before)
    throw ValueError(kCatchUp, "a member passes its optimizer over the old group as `before`", rank);
  if (z.overlap) throw NotSupportedError(kCatchUp, "not with overlap_with_ddp", rank);
  if (zero.redundancy() > 0 && zero.buddy_update() != ZeroBuddyUpdate::step)
    throw NotSupportedError(kCatchUp, "with redundancy, only buddy_update = step so far (replay and host_memory "
                                      "are not implemented yet)", rank);
  ZeroCore* b = before ? &ZeroCoreAccess::core(*before) : nullptr;
  z.settle(kCatchUp);
  if (b) {
    b->settle(kCatchUp);
    if (b->params.size() != z.params.size() || b->params.groups().size() != z.params.groups().size())
      throw ValueError(kCatchUp, "before has " + std::to_string(b->params.size()) + " parameters in " +
                                     std::to_string(b->params.groups().size()) + " groups, zero " +
                                     std::to_string(z.params.size()) + " in " +
                                     std::to_string(z.params.groups().size()), rank);
  }
  // Who keeps each parameter's state in zero: its owner, then its buddies.
  std::vector<std::vector<int>> keepers(z.params.size());
  for (std::size_t i = 0; i < z.params.size(); ++i) {
    const int o = z.part.owner(i);
    keepers[i].push_back(o);
    for (int buddy : z.redundancy->buddies(o)) keepers[i].push_back(buddy);
  }
  const std::vector<int> members = members_of(grown);
  // Every member posts all its sends first, then every rank takes what it
  // keeps in order: no send waits, so nothing waits in a cycle.
  zero_detail::StateByParam local;
  std::vector<Future<void>> sends, recvs;
  std::exception_ptr first;
  try {
    if (b) post_state(z, *b, g, keepers, local, sends);
    if (b && g.rank() == members.front()) send_to_newcomers(*b, g, grown, sends);
    take_state(z, g, members, local, recvs);
    if (newcomer) receive_as_newcomer(z, g, members.front());
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& f : recvs) wait_keeping_first_error(f, first);
  for (auto& f : sends) wait_keeping_first_error(f, first);
  if (first) std::rethrow_exception(first);
  if (b) {
    z.steps = b->steps;
    for (std::size_t gi = 0; gi < z.params.groups().size(); ++gi)
      z.params.groups()[gi].options = b->params.groups()[gi].options->clone();
  }
  z.sync_to_local();
  z.redundancy->install_state(z, std::move(local));
  if (b && z.on_membership_change) z.on_membership_change(join_record(grown, z.steps));  // a join (recovery.hpp)
}

}  // namespace dopt::optim
