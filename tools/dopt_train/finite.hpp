#pragma once
// The per-step check that parameters are finite (dopt-train --nonfinite):
// one pass over every parameter each step, so it must cost next to nothing
// beside the step.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dopt/runtime/tensor.hpp"

namespace dopt_train {

/// The index of the first element of d[0..n) that is NaN or +-inf, or -1.
/// Scans blocks of 1024 floats with a branch-free test on the exponent bits
/// (which the compiler vectorizes) and looks inside a block only when it
/// holds one.
inline std::int64_t first_nonfinite(const float* d, std::int64_t n) {
  constexpr std::int64_t kBlock = 1024;
  constexpr std::uint32_t kExp = 0x7f800000u;  // all ones: inf or NaN
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t e = b + kBlock < n ? b + kBlock : n;
    std::uint32_t bad = 0;
    for (std::int64_t k = b; k < e; ++k) {
      std::uint32_t bits;
      std::memcpy(&bits, d + k, sizeof bits);
      bad |= static_cast<std::uint32_t>((bits & kExp) == kExp);
    }
    if (bad)
      for (std::int64_t k = b; k < e; ++k) {
        std::uint32_t bits;
        std::memcpy(&bits, d + k, sizeof bits);
        if ((bits & kExp) == kExp) return k;
      }
  }
  return -1;
}

/// "parameter 'fc1.weight' holds NaN at element 3", or "" when every
/// element of `params` (named `names`) is finite.
inline std::string nonfinite_parameter(const std::vector<dopt::Tensor>& params, const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const float* d = params[i].data<float>();
    const std::int64_t k = first_nonfinite(d, params[i].numel());
    if (k >= 0)
      return "parameter '" + names[i] + "' holds " + (std::isnan(d[k]) ? "NaN" : "inf") + " at element " +
             std::to_string(k);
  }
  return {};
}

}  // namespace dopt_train
