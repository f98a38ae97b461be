#pragma once
// The reference run of the ZeRO redundancy tests, shared by the simulated
// ranks (zero_redundancy.test.cpp) and the processes
// (tests/survive_peer.cpp), so that both check against one definition.
//
// Rank r's gradient of parameter i at step t, element k, is
// grad_elem(r, t, i, k): a multiple of 1/256 in [-2, 2), so a sum over up to
// 5 ranks is exact in float32 whatever the order. M_t, the members whose
// gradients are averaged at step t, is the initial world minus every rank
// killed at a step < t, and minus the ranks killed at step t "between" steps
// (before the gradient all_reduce): a rank killed inside step t (at its
// beginning, after its local step, or after posting some broadcasts) had
// already contributed to step t, which the survivors complete with those
// gradients. The reference is a plain local optimizer (same spec) stepped T
// times with grad_t = (sum over M_t in rank order) / |M_t| (float32
// division): the run in which the same membership change is applied at the
// same step without a crash. ZeRO runs the same kernels, so the bits match.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dopt/actors/process_group.hpp"
#include "dopt/optim/registry.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::optim::survive_reference {

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline float grad_elem(int r, std::int64_t t, std::size_t i, std::int64_t k) {
  const std::uint64_t h = mix64(mix64(mix64(mix64(static_cast<std::uint64_t>(r) + 1) + static_cast<std::uint64_t>(t)) +
                                      static_cast<std::uint64_t>(i)) +
                                static_cast<std::uint64_t>(k));
  return static_cast<float>(static_cast<std::int64_t>(h % 1024) - 512) / 256.0f;
}

inline float init_elem(std::size_t i, std::int64_t k) {
  const std::uint64_t h = mix64(mix64(1000003ull + i) + static_cast<std::uint64_t>(k));
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/// One float32 parameter (requires_grad) per size, parameter i filled with init_elem(i, .).
inline std::vector<Tensor> make_params(const std::vector<std::int64_t>& sizes) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> v(static_cast<std::size_t>(sizes[i]));
    for (std::int64_t k = 0; k < sizes[i]; ++k) v[static_cast<std::size_t>(k)] = init_elem(i, k);
    Tensor p = Tensor::from_vector(v);
    p.set_requires_grad(true);
    ps.push_back(p);
  }
  return ps;
}

/// Rank r's part of step t's gradients: each parameter's gradient set to
/// grad_elem(r, t, i, .) averaged over `world` (all_reduce, then a float32
/// division by world.size()). Collective: every member of world calls it for
/// step t, on its rank's thread; it waits for the all_reduces.
inline void set_mean_grads(const std::vector<Tensor>& params, ProcessGroup& world, int r, std::int64_t t) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::int64_t n = params[i].numel();
    std::vector<float> g(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k) g[static_cast<std::size_t>(k)] = grad_elem(r, t, i, k);
    Tensor gt = Tensor::from_vector(g);
    world.all_reduce(gt);
    float* d = gt.data<float>();
    for (std::int64_t k = 0; k < n; ++k) d[k] /= static_cast<float>(world.size());
    params[i].set_grad(gt);
  }
}

/// Where a rank is lost: at step() number `step` (step_count() then), at `point`.
struct Kill {
  int rank = -1;         // global rank
  std::int64_t step = 0;
  std::string point;     // "between", "begin", "computed", "broadcast", "snapshot"
  int index = 0;         // broadcast: after posting this one
};

/// M_t of the header, for t < steps.
inline std::vector<std::vector<int>> members_per_step(int n, const std::vector<Kill>& kills, std::int64_t steps) {
  std::vector<std::vector<int>> out;
  for (std::int64_t t = 0; t < steps; ++t) {
    std::vector<int> m;
    for (int r = 0; r < n; ++r) {
      bool gone = false;
      for (const auto& k : kills) gone = gone || (k.rank == r && (k.step < t || (k.step == t && k.point == "between")));
      if (!gone) m.push_back(r);
    }
    out.push_back(m);
  }
  return out;
}

/// What runs after each step of a run (a scheduler's step), made for the
/// run's optimizer before its first step; empty: nothing.
using AfterStep = std::function<std::function<void()>(Optimizer&)>;

/// The reference run's parameters after `steps` steps of a plain `spec`
/// optimizer over make_params(sizes), n ranks at first, `kills` as M_t.
inline std::vector<Tensor> reference_params(const std::vector<std::int64_t>& sizes, const OptimizerSpec& spec, int n,
                                            const std::vector<Kill>& kills, std::int64_t steps,
                                            const AfterStep& make_after_step = {}) {
  auto ps = make_params(sizes);
  std::vector<OptimizerParamGroup> gs;
  gs.emplace_back(ps);
  auto opt = make_optimizer(spec, std::move(gs));
  const std::function<void()> after_step = make_after_step ? make_after_step(*opt) : std::function<void()>();
  const auto members = members_per_step(n, kills, steps);
  for (std::int64_t t = 0; t < steps; ++t) {
    const auto& m = members[static_cast<std::size_t>(t)];
    for (std::size_t i = 0; i < ps.size(); ++i) {
      std::vector<float> g(static_cast<std::size_t>(sizes[i]), 0.0f);
      for (std::int64_t k = 0; k < sizes[i]; ++k) {
        float s = 0.0f;
        for (int r : m) s += grad_elem(r, t, i, k);
        g[static_cast<std::size_t>(k)] = s / static_cast<float>(m.size());
      }
      ps[i].set_grad(Tensor::from_vector(g));
    }
    opt->step();
    if (after_step) after_step();
  }
  return ps;
}

}  // namespace dopt::optim::survive_reference
