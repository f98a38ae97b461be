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

/// The value of __metadata__["dopt.format"] in a state file.
inline constexpr const char* kStateDictFormat = "dopt-state/1";

/// Saves to one safetensors file: tensors as entries named "state.{index}.{key}",
/// param groups and metadata as JSON in __metadata__ ("dopt.param_groups",
/// "dopt.format" = "dopt-state/1", plus every metadata entry). Writes to a
/// temporary file and renames it, so a crash never leaves a half-written file.
/// "dopt.param_groups" is a JSON array of {hyperparameters..., "params": [indices]}.
/// Throws dopt::StateDictError when sd cannot be represented (an undefined
/// state tensor, a negative index, an empty state key, a metadata key
/// "dopt.format"/"dopt.param_groups", a hyperparameter named "params"), and
/// dopt::IOError when writing fails. Tensors on other devices are copied to
/// the host.
void save_state_dict(const StateDict& sd, const std::string& path);
/// Loads a file written by save_state_dict (CPU tensors). Malformed, truncated
/// or hostile files raise dopt::IOError naming the path and the problem; a
/// well-formed safetensors file that is not a valid dopt state (wrong or
/// missing "dopt.format", bad "dopt.param_groups", a tensor not named
/// "state.{index}.{key}", a parameter index listed twice, state for an index
/// no group lists) raises dopt::StateDictError naming the path.
StateDict load_state_dict(const std::string& path);

struct SafetensorsFile;
/// The in-memory forms of the two functions above (for sending a state dict
/// over the wire or resharding); `what` names the source in error messages.
SafetensorsFile state_dict_to_safetensors(const StateDict& sd);
StateDict state_dict_from_safetensors(const SafetensorsFile& file, const std::string& what);

}  // namespace dopt
