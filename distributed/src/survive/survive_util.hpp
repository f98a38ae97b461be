#pragma once
// Internal: the part of surviving a lost rank that the replicated-state
// optimizers share (Reducer, PostLocalSGDOptimizer; docs/fault-tolerance-optimizers.md):
// shrink the group and check that every survivor stopped at the same point.
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "agreement.hpp"
#include "dopt/actors/process_group.hpp"
#include "dopt/distributed/recovery.hpp"

namespace dopt::optim::detail {

/// Whether e holds a PeerLostError (a member was lost: what recovery answers).
inline bool is_peer_lost(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const PeerLostError&) {
    return true;
  } catch (...) {
    return false;
  }
}

/// A collective of the members of `ng`: all-gathers `where` (the caller's
/// position: counters, in/out of a call) and throws StateError (naming `op`,
/// the first two positions that differ and the checkpoint fall-back; the
/// error's rank is `rank`) unless every member passed the same.
inline void check_same_point(ProcessGroup& ng, const char* op, const std::vector<std::int64_t>& where, int rank) {
  const auto all = all_gather_descriptors(ng, where);
  for (int r = 1; r < ng.size(); ++r)
    if (!all.same(static_cast<std::size_t>(r), 0)) {
      auto at = [&](int g) {
        std::string s = "rank " + std::to_string(ng.global_rank(g)) + " at";
        for (auto v : all[static_cast<std::size_t>(g)]) s += " " + std::to_string(v);
        return s;
      };
      throw StateError(op, "the survivors stopped at different points (" + at(0) + ", " + at(r) +
                               "); recovery needs every survivor to stop in the same call. Fall back to "
                               "the last checkpoint",
                       rank);
    }
}

/// A collective of the survivors of `group`: shrinks it, checks with
/// check_same_point that every survivor stopped at `where`, then runs
/// `redo(new group)`;
/// a further PeerLostError during any of it starts again from the old group
/// (its shrink then leaves that rank out too). Returns the recovery record
/// (step = where[0]).
/// Testing aid: called by every survivor in shrink_and_redo once the new
/// group is agreed, before `redo`, with its global rank (a fault-injection
/// test loses a rank there: a loss during the recovery itself).
inline std::function<void(int global_rank)>& recovery_probe() {
  static std::function<void(int)> p;
  return p;
}

inline ZeroRecovery shrink_and_redo(ProcessGroup& group, const char* op, const std::vector<std::int64_t>& where,
                                   const std::function<void(ProcessGroup&)>& redo) {
  const int old_rank = group.global_rank(group.rank());
  for (;;) {
    try {
      ShrinkResult sr = group.shrink();
      ProcessGroup ng = sr.group;
      check_same_point(ng, op, where, old_rank);
      if (recovery_probe()) recovery_probe()(old_rank);
      if (redo) redo(ng);
      ZeroRecovery rec;
      rec.group = ng;
      rec.lost = sr.lost;
      rec.new_rank = sr.new_rank;
      rec.step = where.empty() ? 0 : where[0];
      return rec;
    } catch (const PeerLostError&) {
      // another member lost while recovering: again, from the old group
    }
  }
}

}  // namespace dopt::optim::detail
