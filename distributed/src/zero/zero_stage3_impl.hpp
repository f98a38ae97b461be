#pragma once
// What the ZeRO stage 3 sources (zero_stage3.cpp: units, gathers, reductions,
// step; zero_stage3_state.cpp: state dicts and full parameters) share: the
// state of ShardedUnits. Not installed. Rank thread only.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dopt/distributed/zero_stage3.hpp"

namespace dopt::optim::stage3_detail {

inline constexpr const char* kName = "ShardedUnits";

/// One unit: its parameters' shapes and offsets in the flat unit, this
/// rank's shard, and the gathered buffer while it lives.
struct Unit {
  std::vector<Shape> shapes;
  std::vector<std::int64_t> offsets;  // element offsets in the flat unit
  std::int64_t numel = 0;             // without padding
  std::int64_t shard_numel = 0;       // S = ceil(numel / N)
  Tensor shard;                       // [S], float32, its grad() the averaged shard
  Tensor gathered;                    // [S * N] while gathered or in flight
  Tensor gathered_storage;            // the pooled buffer `gathered` views
  Future<void> gathering;             // the all_gather of `gathered`
  Future<void> reducing;              // reduce_gradients_async in flight
  Tensor reduce_storage;              // the pooled buffer that reduction (or grad_buffer) uses
  Tensor grad_buffer;                 // [S * N] handed out by gradient_buffers, not reduced yet
  bool grads_in_gathered = false;     // reduce_storage is the gather buffer (release_for_gradients)
  bool reduced = false;               // reduced this iteration
};

/// The Checkpointer's snapshot of the shards (items.cpp): shard_state_dict's
/// dict with the tensors shared instead of copied (the caller copies them
/// into its staging memory). Same thread and errors as shard_state_dict.
StateDict shared_shard(ShardedUnits& s, const std::map<std::string, std::string>& metadata);

}  // namespace dopt::optim::stage3_detail

namespace dopt::optim {

struct ShardedUnits::Impl {
  ProcessGroup group;
  ShardedUnitsOptions options;
  OptimizerSpec spec;
  std::vector<stage3_detail::Unit> units;
  std::unique_ptr<Optimizer> optim;  // over the shards, one per unit
  CommHook hook;                     // empty: divide and reduce onto the owners
  bool reduced_once = false;
  std::optional<std::size_t> in_flight;  // the unit whose reduction is in flight (one at most)
  // Buffers reused inside an iteration (fresh pages each gather cost page
  // faults): a released unit's gather buffer (one kept) and the settled
  // reduction's buffer. step() drops both.
  std::vector<Tensor> gather_spares;
  std::vector<Tensor> reduce_spares;

  /// Gives the pages of freed memory back to the OS (glibc's malloc_trim;
  /// nothing elsewhere): freed blocks inside malloc's heap otherwise stay in
  /// the process's RSS until malloc reuses them.
  static void return_freed_memory();
  /// The constructor's checks, shards and optimizer (see the header).
  void init(std::vector<std::vector<Tensor>> units, OptimizerSpec spec, ShardedUnitsOptions options);
  int rank() const { return group.rank(); }
  int world() const { return group.size(); }
  /// ValueError naming `op` for an index out of range.
  stage3_detail::Unit& unit(std::size_t u, const char* op);
  /// Posts the unit's all_gather into a gather buffer, unless it is gathered
  /// or in flight already.
  void start_gather(stage3_detail::Unit& unit);
  /// The views of a gathered buffer in the unit's shapes.
  static std::vector<Tensor> views(const stage3_detail::Unit& unit, const Tensor& flat);
  /// Waits for the unit's reduction in flight (its error is rethrown); its
  /// buffer goes back among the spares when it succeeded (the gather spares
  /// when it was a gather buffer: release_for_gradients).
  void settle_reduction(stage3_detail::Unit& unit);
  /// Posts the reduction of `buffer` (the unit's flat gradient, S * N
  /// floats, padding zero) in place: the hook or divide and reduce; marks
  /// the unit reduced and in flight.
  Future<void> start_reduction(std::size_t u, Tensor buffer, const char* op);
  /// A buffer of `numel` floats: a view of a spare that is large enough
  /// (`storage` gets the spare), else a new one; the other spares are dropped.
  static Tensor take(std::vector<Tensor>& spares, std::int64_t numel, Tensor& storage);
};

}  // namespace dopt::optim
