#pragma once
// What the ZeroRedundancyOptimizer sources share (the name errors give, how a
// parameter is described); not installed.
#include <string>

#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::zero_detail {

inline constexpr const char* kName = "ZeroRedundancyOptimizer";

/// "float32[2, 3]": a parameter as errors and the checkpoint's metadata name it.
inline std::string param_descr(const Tensor& p) {
  return std::string(dtype_name(p.dtype())) + shape_str(p.shape());
}

}  // namespace dopt::optim::zero_detail
