#pragma once
// Bit-for-bit comparisons of tensors and state dicts, for the tests that
// check one code path against another (step_async() against step(), ...).
#include <cstring>
#include <string>

#include "dopt/runtime/state_dict.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::testing {

/// Same dtype, shape and bytes (CPU tensors; dopt tensors are dense).
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

/// "" when both dicts hold the same metadata and the same state tensors bit
/// for bit, else the first difference found.
inline std::string state_dict_difference(const StateDict& a, const StateDict& b) {
  if (a.metadata != b.metadata) return "metadata differs";
  if (a.state.size() != b.state.size()) return "state sizes differ";
  for (const auto& [i, st] : a.state) {
    auto it = b.state.find(i);
    if (it == b.state.end() || it->second.size() != st.size()) return "state of parameter " + std::to_string(i);
    for (const auto& [key, t] : st) {
      auto jt = it->second.find(key);
      if (jt == it->second.end() || !same_bits(t, jt->second))
        return "state " + key + " of parameter " + std::to_string(i) + " differs";
    }
  }
  return "";
}

}  // namespace dopt::testing
