#pragma once
// dopt-train --survive under dopt-run --on-failure replace: a lost rank's
// replacement joins the running job and the survivors grow back to it
// (docs/fault-tolerance-tools.md, "dopt-train --survive"). Both sides run on the
// rank's thread, at a step boundary, in this order: the members grow() the
// training loop's group, every rank of the grown group rebuilds its
// strategy over it with the catch-up (grow_strategy), then one broadcast
// from the grown group's rank 0 gives the newcomers the step to train from
// (their data position: a rank's batches follow the step).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/error.hpp"
#include "strategy.hpp"

namespace dopt_train {

/// A newcomer (a replacement process): waits on its handle `world` until the
/// members grow their group (asking join_group() again after a timeout, 4
/// times at most: the members notice the loss only when a collective times
/// out; join_group()'s PeerLostError, every member gone, ends it at once),
/// then catches up. On return `world` is the grown group, `strategy`
/// the caught-up one; returns the step the members are at.
std::int64_t join_back(dopt::ProcessGroup& world, std::unique_ptr<Strategy>& strategy, const StrategyConfig& cfg,
                       const std::vector<Tensor>& params);

/// A member, at the boundary before step `step` + 1, while `world` is
/// smaller than the job and strategy->can_grow(): a collective of world's
/// members (newcomers_waiting). When replacements wait, grows world to take
/// them, rebuilds `strategy` over the grown group (the old one is spent)
/// and sends the newcomers `step`; returns the newcomers' global ranks
/// (empty: none waited, nothing changed). Where world's plane cannot grow
/// (newcomers_waiting() throws NotSupportedError on every member alike:
/// MPI, a hierarchical world group) sets may_grow to false and returns
/// empty: the caller stops asking.
std::vector<int> grow_back(dopt::ProcessGroup& world, std::unique_ptr<Strategy>& strategy, const StrategyConfig& cfg,
                           const std::vector<Tensor>& params, std::int64_t step, bool& may_grow);

/// --survive: a rank lost after the group grew back (`rejoin` says when)
/// ends the run, in the strategy's step or in the report's all_reduce: the
/// error to throw, naming dopt-train --survive and the step (`step` + 1).
dopt::NotSupportedError no_survival_after_rejoin(int rank, std::int64_t step, const std::string& rejoin,
                                                 const dopt::PeerLostError& lost);

/// A replacement (DOPT_REPLACES) that failed with PeerLostError because its
/// job ended ("rank 0 is gone", at its port or at registration, or "the job
/// ended": every member gone): main exits with 75, a rank
/// that left the job, not 1 (dopt-run --on-failure replace counts it lost).
bool came_after_job_ended(const std::exception& e);

}  // namespace dopt_train
