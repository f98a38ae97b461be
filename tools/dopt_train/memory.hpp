#pragma once
// dopt-train's memory report: what a rank holds, by the library's own
// accounting (parameters, gradients, optimizer state) and as the kernel
// counts it (the process's peak resident set). Local; any thread.
#include <sys/resource.h>

#include <cstdint>

#include "model.hpp"
#include "strategy.hpp"

namespace dopt_train {

struct RankMemory {
  double params = 0;    // the model's parameters (every rank holds them all; stage 3: its shards)
  double grads = 0;     // Strategy::gradient_bytes, or the parameters' gradients
  double state = 0;     // Strategy::state_bytes
  double peak_rss = 0;  // the process's peak resident set so far
  double total() const { return params + grads + state; }
};

/// The process's peak resident set so far, bytes (getrusage: one system call).
inline double peak_rss_bytes() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

inline RankMemory measure_memory(const Mlp& model, const Strategy& strategy) {
  RankMemory m;
  if (const std::int64_t b = strategy.param_bytes(); b >= 0) m.params = static_cast<double>(b);
  else
    for (const Tensor& p : model.params()) m.params += static_cast<double>(p.nbytes());
  const std::int64_t g = strategy.gradient_bytes();
  if (g >= 0) {
    m.grads = static_cast<double>(g);
  } else {
    for (const Tensor& p : model.params())
      if (p.defined() && p.grad().defined()) m.grads += static_cast<double>(p.grad().nbytes());
  }
  m.state = static_cast<double>(strategy.state_bytes());
  m.peak_rss = peak_rss_bytes();
  return m;
}

}  // namespace dopt_train
