#pragma once
// Internal helpers shared by the optimizer sources.
#include <string>

#include "dopt/optim/optimizer.hpp"

namespace dopt::optim::detail {

/// The state tensor under `key`; dopt::StateError naming `op` when absent
/// (e.g. a hand-built or foreign state dict that lacks it).
inline Tensor& state_at(ParamState& st, const char* key, const char* op) {
  auto it = st.find(key);
  if (it == st.end() || !it->second.defined())
    throw StateError(op, std::string("parameter state has no '") + key + "' entry");
  return it->second;
}

/// Adds one to a 0-d step counter in its own dtype's arithmetic (float32
/// counters saturate at 2^24 like torch's) and returns the new value.
inline double increment_step(Tensor& step_t) {
  double s;
  if (step_t.dtype() == DType::float32) s = static_cast<double>(static_cast<float>(step_t.item()) + 1.0f);
  else s = step_t.item() + 1.0;
  step_t.fill_(s);
  return s;
}

}  // namespace dopt::optim::detail
