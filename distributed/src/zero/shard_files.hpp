#pragma once
// What the sharded checkpoints of ZeRO stage 1/2 (zero_state_dict.cpp) and
// stage 3 (zero_stage3_sharded.cpp) share: writing one file per rank with
// every rank learning whether all were written, and finding the world size
// of a folder of such files. Rank thread. Not installed.
#include <regex>
#include <string>

#include "dopt/actors/process_group.hpp"
#include "dopt/runtime/state_dict.hpp"

namespace dopt::optim::zero_detail {

/// Collective over `group`: writes `sd` to dir/file (dir is created), then
/// an all_reduce of the ranks' failures instead of a barrier, so that a
/// failing rank does not leave the others waiting. Rethrows this rank's own
/// failure; IOError naming `op` when another rank's write failed.
void save_shard_everywhere(ProcessGroup group, const StateDict& sd, const std::string& dir, const std::string& file,
                           const std::string& op, int rank);

/// Local: the world size N of the shard files in `dir` whose names match
/// `re` (submatch 1: the rank, 2: N). IOError naming `op` and `rank` for a
/// path that is not a folder, no such file (`pattern` describes the names),
/// files of several world sizes, or a rank's file missing (name(r, N)).
int shard_world_size(const std::string& dir, const std::regex& re, const std::string& pattern,
                     std::string (*name)(int, int), const std::string& op, int rank);

}  // namespace dopt::optim::zero_detail
