#pragma once
// Checks of parameters at an optimizer's construction (internal, not installed; optim/ and ZeRO).
#include <string>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::detail {

/// The CPU kernels step float32 and float64 only: a float16/bfloat16
/// parameter in host memory could never be stepped, so it is refused when
/// the optimizer is built rather than at its first step. 16-bit parameters
/// on a CUDA device are the device kernels' business (gpu/).
inline void refuse_16bit_cpu_param(const Tensor& p, const std::string& op, const std::string& which) {
  if (p.device().is_cpu() && (p.dtype() == DType::float16 || p.dtype() == DType::bfloat16))
    throw DTypeError(op, which + " is " + std::string(dtype_name(p.dtype())) +
                             " on the CPU, which the CPU kernels cannot step (they take float32 and float64): "
                             "keep float32 parameters (a float32 master copy of 16-bit weights), or put them on a "
                             "CUDA device (dopt::gpu::init())");
}

/// A tensor listed twice in one parameter group: torch 1.13 warns, keeps it
/// and steps it twice per step() (two updates from one gradient and one
/// state); dopt refuses it where the group is built, naming both places.
inline std::string duplicate_param_text(std::size_t index, std::size_t first, const Tensor& p) {
  return "parameter " + std::to_string(index) + " of the group is the same tensor as parameter " +
         std::to_string(first) + " (" + p.str() +
         "): a parameter listed twice would be stepped twice per step() by torch; pass each parameter once "
         "(docs/torch-differences.md)";
}

}  // namespace dopt::optim::detail
