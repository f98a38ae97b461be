#pragma once
// Internal: subgroups of any group, not only of the world (the hierarchical
// model averager rebuilds its levels over a shrunk or grown group,
// averagers.cpp). Not installed.
//
// Who calls: every member of `group`, on its rank's thread, at the same point
// of its sequence of calls on the group (it is a collective of the group:
// a barrier, then one meeting per subgroup among its members). Blocks until
// this rank's subgroup is ready; bounded by the group's timeout.
#include "dopt/actors/process_group.hpp"

namespace dopt::detail {

/// Consecutive blocks of group_size of `group`'s ranks (group ranks 0 ..
/// group_size - 1, then the next ones, ...) as groups of their own, like
/// ProcessGroup::new_subgroups on the world, which it calls for the world
/// group. On a group that shrink() or grow() made (or any other that is not
/// the world) the subgroups are made among its members: each subgroup's
/// members meet (in deterministic simulation in the process's memory,
/// otherwise on the rank actors, as shrink's survivors do) and make its part
/// on the group's plane. Their ids follow from the group's id and its call
/// sequence, so every member computes the same ones. Errors name `op` and
/// this rank: a group_size < 1 or not dividing group.size() (ValueError); a
/// group that does not hold this rank (StateError); a group with no view of
/// its members' liveness (NotSupportedError); a member lost while they meet
/// (PeerLostError), or one that does not come (TimeoutError).
Subgroups subgroups_of(ProcessGroup& group, int group_size, const char* op);

/// Whether `group` is the world group (any thread; no communication). False
/// for an invalid group.
bool is_world_group(const ProcessGroup& group);

}  // namespace dopt::detail
