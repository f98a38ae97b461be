#pragma once
// StateDict: an optimizer's state in torch's layout,
//   {"state": {index: {key: tensor}}, "param_groups": [{hyperparameters..., "params": [indices]}]}
// Indices are positions in the chain of all groups' params (torch's ids).
// Scalars such as `step` are 0-d tensors (torch keeps float32 tensors for
// Adam/AdamW/Adamax/Adagrad and Python ints, here int64 0-d tensors, for
// RMSprop/Adadelta/Rprop).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dopt/runtime/hyperparams.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt {

using ParamState = std::map<std::string, Tensor>;

struct StateDict {
  struct Group {
    Hyperparams hyperparams;           // every key except "params"
    std::vector<std::int64_t> params;  // global indices
  };
  std::map<std::int64_t, ParamState> state;
  std::vector<Group> param_groups;
  /// Free-form metadata that travels with the state (format version, partition, ...).
  std::map<std::string, std::string> metadata;
};

/// Saves to one safetensors file: tensors as entries named "state.{index}.{key}",
/// param groups and metadata as JSON in __metadata__ ("dopt.param_groups",
/// "dopt.format" = "dopt-state/1", plus every metadata entry). Writes to a
/// temporary file and renames it, so a crash never leaves a half-written file.
void save_state_dict(const StateDict& sd, const std::string& path);
/// Loads a file written by save_state_dict. Malformed, truncated or hostile
/// files raise dopt::IOError naming the path and the problem.
StateDict load_state_dict(const std::string& path);

}  // namespace dopt
