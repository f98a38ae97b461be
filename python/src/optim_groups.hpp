#pragma once
// Parameter groups and per-parameter state between Python and dopt::optim.
#include "convert.hpp"
#include "dopt/optim/optimizer.hpp"

namespace dopt::python {

/// Groups for the registered optimizer `name`: a group with a dict gets
/// options made from defaults overridden by the dict; one with None takes
/// the optimizer's defaults.
std::vector<optim::OptimizerParamGroup> make_groups(const std::string& name, const Hyperparams& defaults,
                                                    const PyGroups& groups, const char* op);
/// Overwrites the keys in d (validated; unchanged when it throws).
void set_group_hyperparams(optim::OptimizerParamGroup& g, const py::dict& d, const char* op);
/// {key: Tensor} of one parameter's state (empty when st is null).
py::dict param_state_to_py(const ParamState* st);

}  // namespace dopt::python
