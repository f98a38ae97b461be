#pragma once
// What the growing-back tests of post-local SGD and DiLoCo share
// (post_local_sgd_grow.test.cpp, diloco_grow.test.cpp): the run over a
// deterministic simulation with one newcomer, the ranks' gradients, the
// newcomer's join, the reference's ring sum and the bitwise comparison. Rank
// functions run on their rank's thread; the rest on the test's.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/runtime/tensor.hpp"
#include "ring_order_reference.hpp"
#include "zero/zero_survive_reference.hpp"

namespace dopt::grow_test {

/// Each parameter's values, per rank.
using Params = std::vector<std::vector<float>>;

struct Lost : std::runtime_error {
  Lost() : std::runtime_error("lost by the test's hand") {}
};

/// Rank r's gradients of step t: parameter i's element k is grad_elem(r, t, i, k).
inline void set_rank_grads(const std::vector<Tensor>& params, int r, std::int64_t t) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor g = Tensor::zeros({params[i].numel()});
    for (std::int64_t k = 0; k < params[i].numel(); ++k)
      g.data<float>()[k] = optim::survive_reference::grad_elem(r, t, i, k);
    params[i].set_grad(g);
  }
}

/// A newcomer's join_group(). The survivors notice a loss when their
/// collective times out, so the newcomer may wait longer than one
/// join_group() waits: it asks again (at most 4 times).
inline GrowResult join_patiently(RankContext& ctx) {
  for (int tries = 0;; ++tries) {
    try {
      return ctx.world().join_group();
    } catch (const TimeoutError&) {
      if (tries == 3) throw;
    }
  }
}

/// sum over the n group ranks of value(g), in gloo's ring order for element
/// e of a flat float32 buffer of numel elements (the first term taken as is).
template <class Value>
float ring_sum(std::int64_t e, std::int64_t numel, int n, const Value& value) {
  float acc = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float v = value(ring_reference::contributor(e, numel, n, j));
    acc = j == 0 ? v : acc + v;
  }
  return acc;
}

inline Params values_of(const std::vector<Tensor>& params) {
  Params out;
  for (const auto& p : params) out.push_back(p.to_vector<float>());
  return out;
}

/// Runs fn(ctx, log) on `world` ranks and one newcomer (deterministic,
/// `seed`); returns each rank's final parameters (what fn returned; empty
/// for the rank that threw Lost) and log.
inline std::vector<std::pair<Params, std::string>> run_with_newcomer(
    int world, std::uint64_t seed, const std::function<Params(RankContext&, std::string&)>& fn) {
  std::vector<std::pair<Params, std::string>> res(static_cast<std::size_t>(world + 1));
  std::mutex mu;
  SimulateOptions so;
  so.timeout = std::chrono::seconds(60);
  so.deterministic = true;
  so.seed = seed;
  so.newcomers = 1;
  try {
    simulate(world, [&](RankContext& ctx) {
      std::string log;
      Params ps = fn(ctx, log);
      std::lock_guard<std::mutex> lock(mu);
      res[static_cast<std::size_t>(ctx.rank())] = {std::move(ps), std::move(log)};
    }, so);
  } catch (const Error& e) {
    if (std::string(e.what()).find("lost by the test's hand") == std::string::npos) throw;
  }
  return res;
}

/// Every rank but `lost` holds its reference parameters, bit for bit.
inline void check_bitwise(const std::vector<std::pair<Params, std::string>>& got, const std::vector<Params>& ref,
                          int lost) {
  for (std::size_t r = 0; r < got.size(); ++r) {
    if (static_cast<int>(r) == lost) continue;
    INFO("rank " << r << ": " << got[r].second);
    REQUIRE(got[r].first.size() == ref[r].size());
    for (std::size_t i = 0; i < ref[r].size(); ++i) {
      INFO("parameter " << i);
      CHECK(std::memcmp(got[r].first[i].data(), ref[r][i].data(), ref[r][i].size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace dopt::grow_test
