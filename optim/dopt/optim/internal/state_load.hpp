#pragma once
// Internal (not installed; dopt_optim and dopt_distributed): how a saved state
// tensor is placed next to its parameter by Optimizer::load_state_dict and
// FunctionalOptimizer::load_state_dict.
//   * "step" is cloned as saved (a CPU scalar, as torch keeps it).
//   * Every other tensor goes to the parameter's device (a CUDA parameter's
//     state is on its GPU, where the fused kernels read it).
//   * Floating-point state takes the parameter's dtype (torch's rule), except
//     float32 state of a float16/bfloat16 parameter and "master_param", which
//     stay float32: they are the fp32 state and master weights that
//     dopt::gpu::FusedOptions asks for, and rounding them to 16 bits would
//     lose what they are kept for.
//   * Integer state takes the parameter's dtype when `cast_integers` (the
//     Optimizer's rule, torch's), else keeps its dtype.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dopt/optim/optimizer.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::detail {

/// `s` (a state dict's metadata value) as a non-negative integer; StateDictError
/// naming `op` and `what` ("the averager step") when it is not one.
std::int64_t parse_count(const std::string& s, const std::string& op, const std::string& what);

Tensor load_state_value(const Tensor& param, const std::string& key, const Tensor& value, bool cast_integers);

/// Each group's options cloned with the hyperparameters hyper(g) and validated
/// (errors name op): what a load installs once every check has passed, so a
/// failed load leaves the optimizer as it was.
std::vector<std::unique_ptr<OptimizerOptions>> loaded_options(const std::vector<OptimizerParamGroup>& groups,
                                                              const std::function<Hyperparams(std::size_t)>& hyper,
                                                              const std::string& op);

}  // namespace dopt::optim::detail
