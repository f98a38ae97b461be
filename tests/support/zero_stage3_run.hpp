#pragma once
// One rank's training run of the ZeRO stage 3 tests, shared by the simulated
// ranks' test (distributed/src/zero/zero_stage3.test.cpp) and the rank
// program between processes (tests/zero_stage3_peer.cpp): the same model,
// gradients and loop in stage 1 (ZeroRedundancyOptimizer with a Reducer) and
// stage 3 (ShardedUnits: gather with prefetch, reduce_gradients per unit in
// the backward, step), so that the two can be compared bit for bit. Runs on
// the rank's thread; collective over `world`.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dopt/distributed/comm_hooks.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "zero_stage2_run.hpp"

namespace dopt::testing {

struct Stage3Run {
  optim::OptimizerSpec spec;
  std::vector<Shape> shapes;
  /// Parameters per unit, in order (their sum: shapes.size()).
  std::vector<std::size_t> unit_sizes;
  bool fp16 = false;  // fp16_compress_hook in both stages
  int steps = 3;
  /// Stage 3: gather_async and reduce_gradients_async (the gradients dropped
  /// at once) instead of the blocking calls.
  bool async = false;
  /// Stage 3: the backward writes each gradient into gradient_buffers(u)
  /// and reduces them in place (reduce_gradients(u)) instead of passing
  /// its own tensors (a copy).
  bool in_place = false;
  /// Stage 3, with in_place: the buffers are the gathered parameters' memory
  /// (release_for_gradients(u)), and the backward prefetches u - 1 after
  /// taking them, not after the gather.
  bool from_gathered = false;
};

/// What one rank ends with.
struct Stage3Outcome {
  std::vector<Tensor> params;  // every parameter, in full
  StateDict state;             // consolidated (stage 1: on rank 0 only)
  /// Stage 3: ShardedUnits::bytes() after the last step, the largest
  /// gathered_bytes() and buffer_bytes() seen, the largest unit's gathered bytes.
  std::int64_t bytes = 0, peak_gathered = 0, peak_buffers = 0, largest_unit = 0;
};

/// A state dict's tensors in order, each named "index.key".
inline std::vector<std::pair<std::string, Tensor>> named_state(const StateDict& sd) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [idx, st] : sd.state)
    for (const auto& [key, tensor] : st) out.emplace_back(std::to_string(idx) + "." + key, tensor);
  return out;
}

/// The initial value of parameter k (the same on every rank).
/// The small run the stage 3 unit tests share: 8 tensors in 4 units.
inline Stage3Run small_stage3_run(const optim::OptimizerSpec& spec) {
  Stage3Run run;
  run.spec = spec;
  run.shapes = {{7}, {13}, {4, 3}, {32}, {5}, {17}, {9}, {3, 2}};
  run.unit_sizes = {2, 1, 3, 2};
  return run;
}

inline Tensor stage3_param(const Shape& shape, std::size_t k) {
  return Tensor::from_vector(values<float>(static_cast<std::size_t>(shape_numel(shape)), 60 + k), shape);
}

inline Stage3Outcome run_stage1(const ProcessGroup& world, const Stage3Run& run) {
  using namespace dopt::optim;
  std::vector<Tensor> ps;
  for (std::size_t k = 0; k < run.shapes.size(); ++k) ps.push_back(stage3_param(run.shapes[k], k));
  ZeroRedundancyOptimizer zero(ps, run.spec, ZeroOptions{world});
  Reducer red(ps, world, ReducerOptions{.bucket_cap_bytes = 64, .first_bucket_cap_bytes = 24});
  if (run.fp16) red.register_comm_hook(fp16_compress_hook(world));
  for (int t = 0; t < run.steps; ++t) {
    zero.zero_grad(true);
    for (std::size_t k = ps.size(); k-- > 0;) {
      ps[k].set_grad(stage2_grad(run.shapes[k], world.rank(), t, 0, k));
      red.mark_ready(ps[k]);
    }
    red.finalize();
    zero.step();
  }
  Stage3Outcome o;
  o.params = ps;
  zero.consolidate_state_dict(0);
  if (world.rank() == 0) o.state = zero.state_dict();
  return o;
}

/// The units of `run`: its parameters (initial values) grouped by unit_sizes.
inline std::vector<std::vector<Tensor>> stage3_units(const Stage3Run& run) {
  std::vector<std::vector<Tensor>> units;
  std::size_t k = 0;
  for (std::size_t n : run.unit_sizes) {
    units.emplace_back();
    for (std::size_t i = 0; i < n; ++i, ++k) units.back().push_back(stage3_param(run.shapes[k], k));
  }
  return units;
}

/// One training iteration of stage 3 at step t: the forward over the units
/// with prefetch, the backward in reverse with reduce_gradients, the step.
/// `peak` gets the largest gathered_bytes() seen, `peak_buffers` the largest
/// buffer_bytes().
inline void stage3_iteration(optim::ShardedUnits& model, const Stage3Run& run, int t, std::int64_t& peak,
                             std::int64_t& peak_buffers) {
  const std::size_t n = model.num_units();
  const int r = model.rank();
  std::vector<std::size_t> first(n, 0);
  for (std::size_t u = 1; u < n; ++u) first[u] = first[u - 1] + run.unit_sizes[u - 1];
  auto note = [&] {
    peak = std::max(peak, model.gathered_bytes());
    peak_buffers = std::max(peak_buffers, model.buffer_bytes());
  };
  for (std::size_t u = 0; u < n; ++u) {  // forward
    const auto full = model.gather(u);
    if (u + 1 < n) model.prefetch(u + 1);
    note();
    model.release(u);
  }
  const bool from_gathered = run.in_place && run.from_gathered;
  for (std::size_t u = n; u-- > 0;) {  // backward
    const auto full = run.async ? model.gather_async(u).get() : model.gather(u);
    if (u > 0 && !from_gathered) model.prefetch(u - 1);
    note();
    if (run.in_place) {
      std::vector<Tensor> bufs;
      if (from_gathered) {
        bufs = model.release_for_gradients(u);  // the input's gradient, computed from full, would come first
        if (u > 0) model.prefetch(u - 1);
      } else {
        bufs = model.gradient_buffers(u);
      }
      note();
      for (std::size_t i = 0; i < bufs.size(); ++i)
        bufs[i].copy_(stage2_grad(run.shapes[first[u] + i], r, t, 0, first[u] + i));
      if (run.async)
        (void)model.reduce_gradients_async(u);
      else
        model.reduce_gradients(u);
      model.release(u);
      continue;
    }
    note();
    std::vector<Tensor> grads;
    for (std::size_t i = 0; i < full.size(); ++i)
      grads.push_back(stage2_grad(run.shapes[first[u] + i], r, t, 0, first[u] + i));
    if (run.async)
      (void)model.reduce_gradients_async(u, grads);
    else
      model.reduce_gradients(u, grads);
    model.release(u);
  }
  model.step();
}

inline void stage3_iteration(optim::ShardedUnits& model, const Stage3Run& run, int t, std::int64_t& peak) {
  std::int64_t peak_buffers = 0;
  stage3_iteration(model, run, t, peak, peak_buffers);
}

inline Stage3Outcome run_stage3(const ProcessGroup& world, const Stage3Run& run) {
  using namespace dopt::optim;
  ShardedUnits model(stage3_units(run), run.spec, ShardedUnitsOptions{world});
  if (run.fp16) model.register_comm_hook(fp16_compress_hook(world));
  Stage3Outcome o;
  for (int t = 0; t < run.steps; ++t) stage3_iteration(model, run, t, o.peak_gathered, o.peak_buffers);
  o.bytes = model.bytes();
  for (std::size_t u = 0; u < model.num_units(); ++u)
    o.largest_unit = std::max(o.largest_unit, model.shard_numel(u) * world.size() * 4);
  o.params = model.full_parameters();
  o.state = model.state_dict();
  return o;
}

}  // namespace dopt::testing
