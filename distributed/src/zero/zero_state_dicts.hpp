#pragma once
// StateDicts: ZeroRedundancyOptimizer's state dicts (torch's
// consolidate_state_dict / state_dict / load_state_dict) and the sharded
// checkpoint (save_sharded / load_sharded; format in docs/zero.md). Holds
// the consolidated dicts; everything else it reads from (and loads into)
// the ZeroCore it is given. Rank thread; contracts in zero.hpp.
#include <map>
#include <string>
#include <vector>

#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/state_dict.hpp"

namespace dopt::optim::zero_detail {

class StateDicts {
 public:
  /// Collective: every rank's local state dict to group rank `to`.
  void consolidate(ZeroCore& z, int to);
  /// The global dict from the consolidated ones (StateError when none).
  StateDict global(const ZeroCore& z) const;
  /// load_state_dict(sd): the state this rank keeps is copied from sd.
  void load(ZeroCore& z, const StateDict& sd) const;
  /// load_state_dict(path): reads only the state this rank keeps, once,
  /// into the tensors the optimizer then holds (no copy of the whole file).
  void load_file(ZeroCore& z, const std::string& path) const;
  /// Local: this rank's shard as save_sharded writes it, `metadata` added;
  /// `copy`: its state tensors are CPU copies (a snapshot), else shared.
  StateDict shard(const ZeroCore& z, const std::map<std::string, std::string>& metadata, const std::string& op,
                  bool copy) const;
  /// Collective (ends with an all-reduce of the ranks' failures).
  void save_sharded(const ZeroCore& z, const std::string& dir, const std::map<std::string, std::string>& metadata) const;
  ShardLoadReport load_sharded(ZeroCore& z, const std::string& dir) const;
  /// Forgets the consolidated dicts (a recovery: they describe the old group).
  void clear() { consolidated_.clear(); }

 private:
  /// Both loads after their input is read: checks sd against the groups,
  /// installs the kept state (`owned`: sd's tensors may be taken as they are).
  void load_global(ZeroCore& z, const StateDict& sd, const std::string& op, bool owned) const;

  std::vector<StateDict> consolidated_;  // by group rank, on the rank they went to
};

/// The Checkpointer's snapshot of a ZeRO shard (items.cpp): the shard as
/// shard_state_dict(metadata) gives it, with its state tensors shared instead
/// of copied, so that the caller copies them where it likes (its staging
/// memory). Same thread and errors as shard_state_dict.
StateDict shared_shard(ZeroRedundancyOptimizer& z, const std::map<std::string, std::string>& metadata);

}  // namespace dopt::optim::zero_detail
