#pragma once
// Internal to dopt_actors: what a process that joins a running job (a late
// node's newcomer, a lost rank's replacement) must have in common with the
// job, and rank 0's comparison when it admits one (core/rendezvous.cpp;
// InitOptions::compatibility, docs/launching.md "Nodes that arrive later").
//
// Who calls what: init_process_group builds the items on every rank
// (user thread); rank 0 keeps its own in its rendezvous coordinator, a
// newcomer sends its own with its registration, and the coordinator (a CAF
// thread) compares them before it admits the newcomer. Pure functions.
#include <string>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/launch_env.hpp"

namespace dopt::detail {

/// This process's items, flattened as key0, value0, key1, value1, ...: the
/// launch facts dopt knows itself (WORLD_SIZE, LOCAL_WORLD_SIZE and
/// DOPT_MIN_WORLD_SIZE, which is WORLD_SIZE when unset), then
/// options.compatibility in key order. ValueError (op, env.rank) for a
/// program key that is empty or a launch fact's name.
std::vector<std::string> compatibility_items(const LaunchEnv& env, const InitOptions& options, const char* op);

/// "" when `newcomer` holds the same items as `job` (both as
/// compatibility_items returns them), else every difference in key order,
/// joined by "; ": "KEY: the job has A, NAME B", NAME being `newcomer_name`
/// ("this node", "this process"); a launch fact's key names what sets it,
/// and an item one side lacks is "(not declared)" there. A job that
/// declares no items of its own (only the launch facts) compares those
/// only, whatever the newcomer declares.
std::string compatibility_differences(const std::vector<std::string>& job, const std::vector<std::string>& newcomer,
                                      const std::string& newcomer_name);

}  // namespace dopt::detail
