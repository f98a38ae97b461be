#pragma once
// A float64 reference of DiLoCo / Streaming DiLoCo written from the algorithm's
// description (diloco.hpp), independent of DiLoCoAverager: every rank's inner
// SGD and the outer SGD in plain loops, all ranks in one thread. Used by
// diloco.test.cpp (simulated ranks) and tests/diloco_peer.cpp (processes).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dopt/distributed/quantized_all_reduce.hpp"

namespace dopt::diloco_ref {

struct Config {
  int world = 2;
  std::vector<std::int64_t> numels{12, 7, 1, 30};
  std::int64_t sync_every = 4;
  std::vector<std::vector<std::int64_t>> fragments{};  // empty: one
  std::int64_t delay = 0;
  double alpha = 0.0;
  double inner_lr = 0.05, inner_momentum = 0.9;
  double outer_lr = 0.7, outer_momentum = 0.9;
  bool outer_nesterov = true;
  int steps = 13;
};

/// Rank r's gradient of element e of parameter i at step t.
inline double grad(int r, int t, std::int64_t i, std::int64_t e) {
  return 0.5 * std::sin(1.3 * r + 0.7 * t + 2.1 * static_cast<double>(i) + 0.37 * static_cast<double>(e)) +
         0.05 * (r + 1);
}
/// The initial value of element e of parameter i (the same on every rank).
inline double init(std::int64_t i, std::int64_t e) {
  return std::cos(0.9 * static_cast<double>(i) + 0.23 * static_cast<double>(e));
}

/// params[t][r][i][e] after step t, and anchors[t][i][e].
struct Trace {
  std::vector<std::vector<std::vector<std::vector<double>>>> params;
  std::vector<std::vector<std::vector<double>>> anchors;
};

inline Trace run(const Config& c) {
  using Vec = std::vector<double>;
  const std::size_t P = c.numels.size();
  std::vector<std::vector<std::int64_t>> frags = c.fragments;
  if (frags.empty()) {
    frags.emplace_back();
    for (std::size_t i = 0; i < P; ++i) frags[0].push_back(static_cast<std::int64_t>(i));
  }
  const auto F = static_cast<std::int64_t>(frags.size());
  const std::int64_t H = c.sync_every / F;
  std::vector<Vec> anchor(P);
  for (std::size_t i = 0; i < P; ++i)
    for (std::int64_t e = 0; e < c.numels[i]; ++e) anchor[i].push_back(init(static_cast<std::int64_t>(i), e));
  std::vector<std::vector<Vec>> p(static_cast<std::size_t>(c.world), anchor), buf(static_cast<std::size_t>(c.world));
  for (auto& b : buf) b.resize(P);
  std::vector<Vec> outer_buf(P), avg(P);
  Trace tr;
  for (int t = 0; t < c.steps; ++t) {
    for (int r = 0; r < c.world; ++r)
      for (std::size_t i = 0; i < P; ++i) {
        Vec& b = buf[static_cast<std::size_t>(r)][i];
        Vec& x = p[static_cast<std::size_t>(r)][i];
        const bool first = b.empty();
        if (first) b.resize(x.size());
        for (std::size_t e = 0; e < x.size(); ++e) {
          const double g = grad(r, t, static_cast<std::int64_t>(i), static_cast<std::int64_t>(e));
          b[e] = first ? g : c.inner_momentum * b[e] + g;
          x[e] -= c.inner_lr * (c.inner_momentum != 0 ? b[e] : g);
        }
      }
    const std::int64_t l = t % H + 1;
    const auto k = static_cast<std::size_t>((t / H) % F);
    if (l == H - c.delay)
      for (auto i : frags[k]) {
        auto ii = static_cast<std::size_t>(i);
        avg[ii].assign(anchor[ii].size(), 0.0);
        for (int r = 0; r < c.world; ++r)
          for (std::size_t e = 0; e < avg[ii].size(); ++e)
            avg[ii][e] += anchor[ii][e] - p[static_cast<std::size_t>(r)][ii][e];
        for (auto& v : avg[ii]) v /= c.world;
      }
    if (l == H)
      for (auto i : frags[k]) {
        auto ii = static_cast<std::size_t>(i);
        Vec& ob = outer_buf[ii];
        const bool first = ob.empty();
        if (first) ob.resize(anchor[ii].size());
        for (std::size_t e = 0; e < anchor[ii].size(); ++e) {
          double g = avg[ii][e];
          if (c.outer_momentum != 0) {
            ob[e] = first ? g : c.outer_momentum * ob[e] + g;
            g = c.outer_nesterov ? g + c.outer_momentum * ob[e] : ob[e];
          }
          anchor[ii][e] -= c.outer_lr * g;
          for (int r = 0; r < c.world; ++r) {
            double& x = p[static_cast<std::size_t>(r)][ii][e];
            x = anchor[ii][e] + c.alpha * (x - anchor[ii][e]);
          }
        }
      }
    tr.params.push_back(p);
    tr.anchors.push_back(anchor);
  }
  return tr;
}

/// quantized_all_reduce's averaging of inputs[r] (every rank's float32
/// buffer) in float64: each rank's chunks quantized with float64 scales and
/// rounding, decoded, summed and divided in float64, re-quantized and
/// decoded. `mean` is the result, `exact` the plain mean, `tol1` / `tol2` one
/// quantum of the first stage (summed over the ranks, divided by n) and of
/// the second, per element: a float32 implementation of the same
/// quantization is within tol1 + tol2 of `mean` (it may round a value on a
/// quantum boundary the other way) and, rounding to nearest, within
/// (tol1 + tol2) / 2 of `exact` (plus float32 rounding).
struct WireReference {
  std::vector<double> mean, exact, tol1, tol2;
};

inline WireReference wire_reference(const std::vector<std::vector<float>>& inputs, optim::WireFormat f,
                                    std::int64_t row_size) {
  using optim::WireFormat;
  const int n = static_cast<int>(inputs.size());
  const auto N = static_cast<std::int64_t>(inputs[0].size());
  const int qmax = f == WireFormat::int8 ? 127 : 7;
  auto quant = [&](std::vector<double>& x, std::int64_t a, std::int64_t e, std::vector<double>& step) {
    if (f == WireFormat::float32) return;
    if (f == WireFormat::bfloat16 || f == WireFormat::float16) {
      for (std::int64_t i = a; i < e; ++i) {
        double& v = x[static_cast<std::size_t>(i)];
        const int ex = std::ilogb(v == 0 ? 1e-30 : v);
        const double ulp = f == WireFormat::bfloat16 ? std::ldexp(1.0, ex - 7) : std::ldexp(1.0, std::max(ex, -14) - 10);
        v = std::nearbyint(v / ulp) * ulp;
        step[static_cast<std::size_t>(i)] = std::max(step[static_cast<std::size_t>(i)], ulp);
      }
      return;
    }
    for (std::int64_t row = a; row < e; row += row_size) {
      const std::int64_t end = std::min(e, row + row_size);
      double amax = 0;
      for (std::int64_t i = row; i < end; ++i) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(i)]));
      const double s = amax / qmax;
      for (std::int64_t i = row; i < end; ++i) {
        double& v = x[static_cast<std::size_t>(i)];
        v = s == 0 ? 0 : std::clamp(std::nearbyint(v / s), -double(qmax), double(qmax)) * s;
        step[static_cast<std::size_t>(i)] = std::max(step[static_cast<std::size_t>(i)], s);
      }
    }
  };
  WireReference ref;
  const auto sz = static_cast<std::size_t>(N);
  ref.mean.assign(sz, 0.0);
  ref.exact.assign(sz, 0.0);
  ref.tol1.assign(sz, 0.0);
  ref.tol2.assign(sz, 0.0);
  for (int r = 0; r < n; ++r) {
    std::vector<double> x(inputs[static_cast<std::size_t>(r)].begin(), inputs[static_cast<std::size_t>(r)].end());
    for (std::size_t e = 0; e < sz; ++e) ref.exact[e] += x[e] / n;
    std::vector<double> s(sz, 0.0);
    for (int c = 0; c < n; ++c) {
      const auto [a, e] = optim::chunk_range(N, n, c, row_size);
      quant(x, a, e, s);
    }
    for (std::size_t e = 0; e < sz; ++e) {
      ref.tol1[e] += s[e] / n;
      ref.mean[e] += x[e];
    }
  }
  for (auto& v : ref.mean) v /= n;
  for (int c = 0; c < n; ++c) {
    const auto [a, e] = optim::chunk_range(N, n, c, row_size);
    quant(ref.mean, a, e, ref.tol2);
  }
  return ref;
}

/// Rank r's input of the wire-format tests: smooth values with spikes (so
/// that rows have different scales).
inline float wire_input(int r, std::int64_t e) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(e) + r) * (1.0 + 0.1 * r) + (e % 17 == 0 ? 3.0 : 0.0));
}

}  // namespace dopt::diloco_ref
