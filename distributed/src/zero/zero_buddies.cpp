// Buddies (zero_buddies.hpp): the buddy table, step()'s end with buddies,
// and CopyBuddies (ZeroBuddyUpdate::step): a copy of each kept shard,
// stepped every step. The recovery: zero_recovery.cpp.
#include "zero_buddies.hpp"

#include <algorithm>
#include <string>
#include <tuple>

#include "dopt/actors/host.hpp"
#include "survive/agreement.hpp"
#include "zero_core.hpp"
#include "zero_internal.hpp"

namespace dopt::optim::zero_detail {
namespace {

int capped(int requested, int world) { return std::max(0, std::min(requested, world - 1)); }

/// The buddies of every rank of a group whose rank r is on host[r]; k is
/// already capped at size - 1. One host: r+1, ..., r+k cyclically. Several:
/// the ranks are listed host by host in turn (the first rank of every host
/// in order of their first rank, then the second of each, ...), and in that
/// order each rank takes k buddies: ranks on other hosts first, then the
/// ones that keep the fewest shards so far, then the nearest after it in the
/// list. Every rank computes the same table.
std::vector<std::vector<int>> choose_buddies(const std::vector<std::string>& host, int k) {
  const int n = static_cast<int>(host.size());
  std::vector<std::vector<int>> out(static_cast<std::size_t>(n));
  std::vector<std::string> hosts;  // in order of their first rank
  std::vector<std::vector<int>> on;  // ranks of each host, ascending
  for (int r = 0; r < n; ++r) {
    auto it = std::find(hosts.begin(), hosts.end(), host[static_cast<std::size_t>(r)]);
    if (it == hosts.end()) {
      hosts.push_back(host[static_cast<std::size_t>(r)]);
      on.emplace_back();
      it = hosts.end() - 1;
    }
    on[static_cast<std::size_t>(it - hosts.begin())].push_back(r);
  }
  if (hosts.size() <= 1) {
    for (int r = 0; r < n; ++r)
      for (int j = 1; j <= k; ++j) out[static_cast<std::size_t>(r)].push_back((r + j) % n);
    return out;
  }
  std::vector<int> order, pos(static_cast<std::size_t>(n), 0), load(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 0; order.size() < static_cast<std::size_t>(n); ++i)
    for (const auto& rs : on)
      if (i < rs.size()) order.push_back(rs[i]);
  for (int j = 0; j < n; ++j) pos[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] = j;
  for (int r : order) {
    const auto ur = static_cast<std::size_t>(r);
    std::vector<int> cand;
    for (int c = 0; c < n; ++c)
      if (c != r) cand.push_back(c);
    auto key = [&](int c) {
      const auto uc = static_cast<std::size_t>(c);
      return std::make_tuple(host[uc] == host[ur] ? 1 : 0, load[uc], (pos[uc] - pos[ur] + n) % n);
    };
    std::sort(cand.begin(), cand.end(), [&](int a, int b) { return key(a) < key(b); });
    for (int j = 0; j < k; ++j) {
      out[ur].push_back(cand[static_cast<std::size_t>(j)]);
      ++load[static_cast<std::size_t>(cand[static_cast<std::size_t>(j)])];
    }
  }
  return out;
}


/// 64-bit FNV-1a of a string, as a non-negative int64.
std::int64_t host_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(h >> 1);
}

}  // namespace

int Buddies::k(int world) const noexcept { return capped(requested_, world); }

std::vector<int> Buddies::buddies(int r) const {
  if (table_.empty()) return {};
  return table_[static_cast<std::size_t>(r)];
}

std::vector<std::vector<int>> Buddies::table_for(const std::vector<std::string>& hosts, int k) const {
  return choose_buddies(hosts, k);
}

void Buddies::start(ZeroCore& z, const ZeroOptions& options) {
  const auto& given = options.hosts;
  const auto& members = z.group.ranks();
  host_of_.clear();
  if (!given.empty()) {
    if (static_cast<int>(given.size()) != z.world)
      throw ValueError(kName, "ZeroOptions::hosts names " + std::to_string(given.size()) +
                                  " host(s), but the group has " + std::to_string(z.world) + " ranks", z.rank);
    for (int r = 0; r < z.world; ++r)
      host_of_[members[static_cast<std::size_t>(r)]] = given[static_cast<std::size_t>(r)];
  } else {
    // Measured: every rank's host id, as a hash (equal ids, equal hashes).
    const auto all = ::dopt::optim::detail::all_gather_descriptors(z.group, {host_hash(this_host_id())});
    for (int r = 0; r < z.world; ++r)
      host_of_[members[static_cast<std::size_t>(r)]] = std::to_string(all.at(static_cast<std::size_t>(r), 0));
  }
  table_ = table_of(members);
  setup(z);
  if (z.bucket_view) build_buckets(z);
}

std::vector<std::vector<int>> Buddies::table_of(const std::vector<int>& members) const {
  std::vector<std::string> host;
  for (int g : members) {
    auto it = host_of_.find(g);
    host.push_back(it == host_of_.end() ? std::string() : it->second);
  }
  return table_for(host, capped(requested_, static_cast<int>(members.size())));
}

void Buddies::check_closure(const Optimizer::LossClosure& closure, int rank) const {
  if (closure)
    throw ValueError(std::string(kName) + ".step",
                     "a closure cannot be used with redundancy (the buddies step their copies with the gradients "
                     "step() is called with)", rank);
}

void Buddies::check_add_group(const std::string& op, int rank) const {
  throw NotSupportedError(op, "ZeroRedundancyOptimizer with redundancy cannot add parameter groups; pass every "
                              "group to the constructor", rank);
}

void Buddies::sync_shards(ZeroCore& z, const std::function<void()>& meanwhile) { z.broadcast_shards(meanwhile); }

std::optional<ZeroRecovery> Buddies::finish_step(ZeroCore& z, Future<void>& notify) {
  try {
    sync_shards(z, nullptr);
    notify.get();
    ++z.steps;
    return std::nullopt;
  } catch (const PeerLostError&) {
  }
  return recover_from_loss(z, /*in_step=*/true);
}

ZeroRecovery Buddies::recover(ZeroCore& z) { return recover_from_loss(z, false); }

// --- CopyBuddies -------------------------------------------------------------------

void CopyBuddies::setup(ZeroCore& z) { make_copies(z); }

void CopyBuddies::make_copies(ZeroCore& z) {
  copies_.clear();
  for (int target = 0; target < z.world; ++target) {
    const auto& bs = table_[static_cast<std::size_t>(target)];
    if (std::find(bs.begin(), bs.end(), z.rank) == bs.end()) continue;
    copies_[target] = make_optimizer(z.spec, z.part.local_groups(z.params, target));
  }
}

void CopyBuddies::after_local_step(ZeroCore& z) {
  // The owner steps with ZeRO's hyperparameters (sync_to_local) and the
  // averaged gradients every rank holds: so does each copy, bitwise alike.
  const auto& groups = z.params.groups();
  for (auto& [target, copy] : copies_) {
    auto& gs = copy->param_groups();
    for (std::size_t g = 0; g < groups.size() && g < gs.size(); ++g) gs[g].options = groups[g].options->clone();
    copy->step();
  }
}

bool CopyBuddies::keeps_state_of(const ZeroCore& z, std::size_t i) const {
  const int o = z.part.owner(i);
  return o == z.rank || copies_.count(o) > 0;
}

void CopyBuddies::install_state(ZeroCore& z, StateByParam local) {
  for (auto& [r, copy] : copies_) copy->state().clear();
  for (auto it = local.begin(); it != local.end();) {  // the buddies' part
    const int o = z.part.owner(static_cast<std::size_t>(z.params.index_of_key(it->first)));
    if (o == z.rank) {
      ++it;
      continue;
    }
    copies_.at(o)->state()[it->first] = std::move(it->second);
    it = local.erase(it);
  }
  z.optim->state() = std::move(local);
}

std::int64_t CopyBuddies::copy_bytes() const {
  std::int64_t b = 0;
  for (const auto& [r, copy] : copies_)
    for (const auto& [k, st] : copy->state())
      for (const auto& [name, t] : st)
        if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  return b;
}

void CopyBuddies::add_available(const Loss&, StateByParam& avail) const {
  for (const auto& [t, copy] : copies_)
    for (const auto& [k, st] : copy->state()) avail[k] = st;
}

void CopyBuddies::commit(ZeroCore& z, const StateByParam& avail) {
  make_copies(z);
  for (auto& [t, copy] : copies_)
    for (const auto& p : z.part.shard(t)) {
      auto it = avail.find(p.key());
      if (it != avail.end()) copy->state()[p.key()] = it->second;
    }
}

}  // namespace dopt::optim::zero_detail
