#pragma once
// One rank's training run of the ZeRO stage 2 tests, shared by the simulated
// ranks' test (distributed/src/zero/zero_stage2.test.cpp) and the rank
// program between processes (tests/zero_stage2_peer.cpp): the same model,
// gradients and loop in stage 1 (ZeroRedundancyOptimizer with a plain
// Reducer) and stage 2 (the Reducer with zero_stage2_options), so that the
// two can be compared bit for bit. Runs on the rank's thread; collective
// over `world` (every rank runs it with the same Stage2Run).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "dopt/actors/join.hpp"
#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "reference_data.hpp"

namespace dopt::testing {

struct Stage2Run {
  optim::OptimizerSpec spec;
  std::vector<Shape> shapes;
  optim::ZeroPartitionWeight weight = optim::ZeroPartitionWeight::element_count;
  bool fp16 = false;  // fp16_compress_hook in both stages
  int steps = 3;
  int micro = 1;       // micro-batches per step: the first micro - 1 under no_sync
  bool join = false;   // rank r runs steps - r iterations, under Join
  std::size_t bucket_cap_bytes = 64, first_bucket_cap_bytes = 24;
};

/// What one rank ends with.
struct Stage2Outcome {
  std::vector<Tensor> params;  // every parameter
  std::vector<Tensor> grads;   // the owned parameters' gradients, by global index
  StateDict state;             // the local optimizer's
  int foreign_grads = 0;       // gradients held of parameters owned elsewhere
  /// Reducer::gradient_bytes() after the last finalize; the owned and all
  /// parameters' bytes; the largest bucket's bytes.
  std::int64_t gradient_bytes = 0, owned_bytes = 0, total_bytes = 0, largest_bucket = 0;
  /// The largest Reducer::gradient_bytes() seen after a mark_ready.
  std::int64_t peak_gradient_bytes = 0;
};

/// Rank r's gradient of parameter k at step t, micro-batch j: arbitrary
/// floats (their sums are not exact, so the summation order shows).
inline Tensor stage2_grad(const Shape& shape, int r, int t, int j, std::size_t k) {
  const auto n = static_cast<std::size_t>(shape_numel(shape));
  return Tensor::from_vector(values<float>(n, 5000 + 1000 * k + 131 * static_cast<std::uint64_t>(r) +
                                                  17 * static_cast<std::uint64_t>(t) + static_cast<std::uint64_t>(j),
                                           3.0),
                             shape);
}

inline Stage2Outcome run_stage(const ProcessGroup& world, const Stage2Run& run, bool stage2) {
  using namespace dopt::optim;
  const int r = world.rank();
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < run.shapes.size(); ++i)
    ps.push_back(Tensor::from_vector(values<float>(static_cast<std::size_t>(shape_numel(run.shapes[i])), 60 + i),
                                     run.shapes[i]));
  ZeroOptions zo;
  zo.process_group = world;
  zo.partition_weight = run.weight;
  ZeroRedundancyOptimizer zero(ps, run.spec, zo);
  const ReducerOptions ro{.bucket_cap_bytes = run.bucket_cap_bytes, .first_bucket_cap_bytes = run.first_bucket_cap_bytes};
  Reducer red(ps, world, stage2 ? zero_stage2_options(zero, ps, ro) : ro);
  if (run.fp16) red.register_comm_hook(fp16_compress_hook(world));
  std::optional<Join> join;
  if (run.join) join.emplace(std::vector<Joinable*>{&red, &zero});
  Stage2Outcome o;
  const int iters = run.join ? run.steps - r : run.steps;
  for (int t = 0; t < iters; ++t) {
    zero.zero_grad(true);
    for (int j = 0; j < run.micro; ++j) {
      std::optional<Reducer::NoSync> guard;
      if (j + 1 < run.micro) guard.emplace(red.no_sync());
      for (std::size_t k = ps.size(); k-- > 0;) {  // in the order a backward pass produces them
        Tensor g = stage2_grad(run.shapes[k], r, t, j, k);
        if (ps[k].grad().defined()) {  // accumulate (no_sync): float32 adds, as a trainer's
          float* acc = ps[k].grad().data<float>();
          for (std::int64_t e = 0; e < g.numel(); ++e) acc[e] += g.data<float>()[e];
        } else {
          ps[k].set_grad(g);
        }
        red.mark_ready(ps[k]);
        o.peak_gradient_bytes = std::max(o.peak_gradient_bytes, red.gradient_bytes());
      }
      red.finalize();
    }
    o.gradient_bytes = red.gradient_bytes();
    zero.step();
  }
  if (join) join->finish();
  const auto owners = zero.param_owners();
  for (std::size_t k = 0; k < ps.size(); ++k) {
    o.params.push_back(ps[k]);
    o.total_bytes += static_cast<std::int64_t>(ps[k].nbytes());
    if (owners[k] == r) {
      o.grads.push_back(ps[k].grad());
      o.owned_bytes += static_cast<std::int64_t>(ps[k].nbytes());
    } else if (ps[k].grad().defined()) {
      ++o.foreign_grads;
    }
  }
  for (const auto& b : red.bucket_indices()) {
    std::int64_t n = 0;
    for (auto k : b) n += static_cast<std::int64_t>(ps[k].nbytes());
    if (n > o.largest_bucket) o.largest_bucket = n;
  }
  o.state = zero.optim().state_dict();
  return o;
}

}  // namespace dopt::testing
