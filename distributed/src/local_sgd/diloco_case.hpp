#pragma once
// A DiLoCo test case (diloco_reference.hpp's Config) as what DiLoCoAverager
// runs on: its options, the initial parameters, a rank's gradients of a
// step. Shared by diloco.test.cpp (simulated ranks) and tests/diloco_peer.cpp
// (processes), so that both run the case the reference computes. Called on
// a rank's thread; nothing here communicates.
#include <cstdint>
#include <vector>

#include "diloco_reference.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/runtime/tensor.hpp"

namespace dopt::diloco_ref {

/// c's DiLoCoOptions: its sync period, fragments, delay, alpha, and the
/// outer SGD (lr, momentum, nesterov).
inline optim::DiLoCoOptions options_of(const Config& c) {
  optim::DiLoCoOptions o;
  o.sync_every = c.sync_every;
  o.fragments = c.fragments;
  o.fragment_sync_delay = c.delay;
  o.fragment_update_alpha = c.alpha;
  o.outer_optimizer = {"SGD", {{"lr", c.outer_lr}, {"momentum", c.outer_momentum}, {"nesterov", c.outer_nesterov}}};
  return o;
}

/// c's parameters at the start (init), in dtype dt.
inline std::vector<Tensor> init_params(const Config& c, DType dt) {
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < c.numels.size(); ++i) {
    std::vector<double> v;
    for (std::int64_t e = 0; e < c.numels[i]; ++e) v.push_back(init(static_cast<std::int64_t>(i), e));
    ps.push_back(Tensor::from_vector(v).to(dt));
  }
  return ps;
}

/// Sets ps's gradients to rank r's of step t (grad), in each parameter's dtype.
inline void set_grads(const Config& c, int r, int t, const std::vector<Tensor>& ps) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    std::vector<double> g;
    for (std::int64_t e = 0; e < c.numels[i]; ++e) g.push_back(grad(r, t, static_cast<std::int64_t>(i), e));
    ps[i].set_grad(Tensor::from_vector(g).to(ps[i].dtype()));
  }
}

}  // namespace dopt::diloco_ref
