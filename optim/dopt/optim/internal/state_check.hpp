#pragma once
// Plausibility checks of optimizer state read from a checkpoint or a state
// dict. A checksum proves that a file holds what was written; these checks
// catch state that no optimizer step can produce, whether it was written
// that way (a NaN that training produced) or planted:
//   * a floating-point state tensor holding NaN or +-Inf;
//   * a negative value in a state that is a sum of squares, a maximum of
//     magnitudes, a step size or a step count: "exp_avg_sq",
//     "max_exp_avg_sq", "square_avg", "sum", "acc_delta", "exp_inf",
//     "step_size", "step".
// Every optimizer's load_state_dict(), ZeroRedundancyOptimizer's
// load_state_dict() and load_sharded() run them on every state tensor before
// anything changes, and throw StateDictError naming the state, the parameter
// (and the file) and the first bad element.
#include <string>

#include "dopt/runtime/tensor.hpp"

namespace dopt::optim {

/// "" when value is plausible for state `key`, else what is wrong
/// ("holds NaN at element 17 of 4096", "holds -1 at element 0 of 1, but
/// 'exp_avg_sq' is never negative"). Tensors on a device are copied to the
/// host for the check.
std::string find_impossible_state(const std::string& key, const Tensor& value);

/// Throws StateDictError(op, what + " " + problem + "; ...") when
/// find_impossible_state() finds something; `what` names the tensor
/// ("state 'exp_avg_sq' of parameter id 3", "FILE: tensor 'state.3.exp_avg_sq'").
void check_state_value(const std::string& op, const std::string& what, const std::string& key,
                       const Tensor& value);

}  // namespace dopt::optim
