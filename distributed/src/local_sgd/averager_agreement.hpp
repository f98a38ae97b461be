#pragma once
// Internal (not installed): the ranks of a group agree on how their model
// averagers were built (averagers.cpp, post_local_sgd_grow.cpp). A newcomer
// builds its averager itself; one built with another map, warm-up or period
// than the members' would average alone or with other ranks than the
// members expect (silently wrong), or make other subgroups (a hang).
//
// Who calls: every member of `group`, on its rank's thread, at the same
// point of its calls on the group (one all_gather: a collective). A
// HierarchicalModelAverager agrees before it makes its levels over a group
// that is not the world (its constructor; take_grown_group), a
// PeriodicModelAverager in post_local_sgd_catch_up, a DiLoCoAverager in its
// take_grown_group (which post_local_sgd_catch_up calls on every rank), so
// that a newcomer and the members meet in the same exchange whichever kind
// each built.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dopt/actors/process_group.hpp"

namespace dopt::optim::detail {

/// What must be equal on every rank. Periodic: levels = {period: 0}.
/// DiLoCo: no levels; `settings` (name, value as text) in a fixed order, at
/// most kMaxSettings, each compared whole (a value longer than the shown
/// text is compared by its length and hash).
struct AveragerConfig {
  enum Kind : std::int64_t { periodic = 1, hierarchical = 2, diloco = 3 } kind;
  std::int64_t warmup_steps;
  std::map<std::int64_t, int> levels;
  std::vector<std::pair<std::string, std::string>> settings = {};
};
inline constexpr int kMaxSettings = 12;

/// "HierarchicalModelAverager {2: 2, 4: 6}, warm-up 1",
/// "PeriodicModelAverager period 2, warm-up 1".
std::string describe(const AveragerConfig& c);

/// All-gathers every rank's config over `group`. When one differs from
/// group rank 0's, every rank throws ValueError naming `op` and this rank
/// (group rank): the first rank that differs (group and global rank) and
/// both configurations; when every rank's is a DiLoCo one, each setting that
/// differs instead, with its values and the global ranks that have each
/// ("sync_every: ranks 0-2, 4 have 4, rank 5 has 8").
void agree_averager_config(ProcessGroup& group, const AveragerConfig& mine, const char* op);

}  // namespace dopt::optim::detail
