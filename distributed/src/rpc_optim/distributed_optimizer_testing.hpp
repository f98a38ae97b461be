#pragma once
// Test hooks of DistributedOptimizer's owner side: not installed. The unit
// tests include this header to kill an owner's worker at a chosen point of
// its step. Hooks are process-wide; set them before the step and clear them
// (an empty function) after.
#include <functional>

#include "dopt/distributed/distributed_optimizer.hpp"

namespace dopt::optim::detail {

/// Called on the owner at the start of every owner step, with the step count
/// of that owner's local optimizer (e.g. to kill the worker mid-step).
void set_owner_step_hook(std::function<void(rpc::Agent&, long step)> hook);
/// Called on the owner (redundancy) at points of its step: "begin" (before
/// it read and forwarded the gradients), "mirrored" (after its own step and
/// its buddies' replies, before it replies), with the step number; and on a
/// buddy at "promote" (its copy is being taken over), with the copy's step
/// count. Returning true aborts there (after the hook killed the worker).
void set_owner_probe(std::function<bool(rpc::Agent&, const char* point, long step)> probe);

}  // namespace dopt::optim::detail
