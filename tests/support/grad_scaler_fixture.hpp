#pragma once
// The GradScaler tests' scaler, parameters and gradients, shared by optim's
// grad_scaler tests and the ZeRO / PostLocalSGD training tests of distributed/.
#include <limits>
#include <vector>

#include "dopt/optim/grad_scaler.hpp"
#include "reference_data.hpp"

namespace dopt::testing {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// init 8, growth x2 every 3 good steps, back-off x0.25.
inline optim::GradScalerOptions small_scaler() {
  optim::GradScalerOptions o;
  o.init_scale = 8.0;
  o.growth_factor = 2.0;
  o.backoff_factor = 0.25;
  o.growth_interval = 3;
  return o;
}

inline std::vector<Tensor> make_params(int n, int seed) {
  std::vector<Tensor> ps;
  for (int k = 0; k < n; ++k)
    ps.push_back(tensor_of(values<float>(static_cast<std::size_t>(3 + 2 * k), static_cast<std::uint64_t>(seed + k))));
  return ps;
}

/// Gradients (scaled by `scale`) of step t on rank r (rank -1: the same on every rank).
inline void set_grads(const std::vector<Tensor>& ps, int t, int r, double scale) {
  for (std::size_t k = 0; k < ps.size(); ++k) {
    auto v = values<float>(static_cast<std::size_t>(ps[k].numel()),
                           7000 + 100 * static_cast<std::uint64_t>(t) + 13 * static_cast<std::uint64_t>(r + 1) + k);
    for (auto& x : v) x = static_cast<float>(x * scale);
    ps[k].set_grad(tensor_of(v));
  }
}

inline bool all_equal(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (std::size_t k = 0; k < a.size(); ++k)
    if (!a[k].equal(b[k])) return false;
  return true;
}

inline std::vector<Tensor> clones(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const auto& p : ps) out.push_back(p.clone());
  return out;
}

}  // namespace dopt::testing
