// ShardedUnits (zero_stage3.hpp), ZeRO stage 3: the units and their shards,
// the all_gathers of gather/prefetch, the reductions of each shard onto its
// rank, the buffers they reuse, the local step and the byte counts. The
// state dicts and full parameters are in zero_stage3_state.cpp. Rank thread
// only.
#include <algorithm>
#include <set>
#include <string>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include "dopt/distributed/internal/device_ops.hpp"
#include "zero/zero_host_memory.hpp"  // zero_detail::elementwise_optimizer
#include "zero/zero_stage3_impl.hpp"

namespace dopt::optim {

using stage3_detail::kName;
using stage3_detail::Unit;

void ShardedUnits::Impl::init(std::vector<std::vector<Tensor>> given, OptimizerSpec spec_in,
                              ShardedUnitsOptions options_in) {
  static constexpr const char* op = kName;
  if (!options_in.process_group.valid()) throw ValueError(op, "invalid process group");
  group = options_in.process_group;
  options = std::move(options_in);
  spec = std::move(spec_in);
  const int rank = this->rank(), world = this->world();
  if (options.redundancy > 0)
    throw NotSupportedError(op, "redundancy " + std::to_string(options.redundancy) +
                                    " is not supported in stage 3 (buddies would keep other ranks' shards; use "
                                    "redundancy = 0, or stage 1)", rank);
  if (!zero_detail::elementwise_optimizer(spec.name))
    throw NotSupportedError(op, "optimizer " + spec.name + " does not step elementwise (Muon needs whole matrices); "
                                "stage 3 steps flat shards: use an elementwise one (SGD, Adam, AdamW, Adagrad, RMSprop, Adamax, "
                                "Adadelta, Rprop, NAdam, RAdam), or stages 1 and 2 for " +
                                    spec.name, rank);
  if (given.empty()) throw ValueError(op, "no units", rank);
  std::set<const void*> seen;
  std::vector<Tensor> shards;
  for (std::size_t u = 0; u < given.size(); ++u) {
    const std::vector<Tensor>& ps = given[u];
    const std::string where = "unit " + std::to_string(u);
    if (ps.empty()) throw ValueError(op, where + " has no parameters", rank);
    Unit unit;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const Tensor& p = ps[i];
      const std::string what = where + " parameter " + std::to_string(i);
      if (!p.defined()) throw ValueError(op, what + " is undefined", rank);
      if (p.dtype() != DType::float32 || !p.device().is_cpu())
        throw TypeError(op, what + " (" + p.str() + ") is not a float32 CPU tensor", rank);
      if (p.numel() > 0 && !seen.insert(p.data_ptr()).second)
        throw ValueError(op, what + " (" + p.str() + ") is already in a unit", rank);
      unit.shapes.push_back(p.shape());
      unit.offsets.push_back(unit.numel);
      unit.numel += p.numel();
    }
    if (unit.numel == 0) throw ValueError(op, where + " has no elements", rank);
    unit.shard_numel = (unit.numel + world - 1) / world;
    // One unit in full at a time: the values (rank 0's), then this rank's part.
    Tensor flat = Tensor::zeros({unit.shard_numel * world});
    for (std::size_t i = 0; i < ps.size(); ++i)
      flat.flat_slice(unit.offsets[i], ps[i].numel()).view(ps[i].shape()).copy_(ps[i]);
    if (options.broadcast_parameters) group.broadcast(flat, 0);
    unit.shard = flat.flat_slice(rank * unit.shard_numel, unit.shard_numel).clone();
    unit.shard.set_grad(Tensor::zeros({unit.shard_numel}));
    shards.push_back(unit.shard);
    units.push_back(std::move(unit));
    given[u].clear();  // the caller's full tensors go now when it moved them in
  }
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::move(shards));
  optim = make_optimizer(spec, std::move(groups));
  return_freed_memory();  // the full tensors the caller moved in (those below the mmap threshold sit in malloc's heap)
}

void ShardedUnits::Impl::return_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

Unit& ShardedUnits::Impl::unit(std::size_t u, const char* op) {
  if (u >= units.size())
    throw ValueError(op, "unit " + std::to_string(u) + " is not one of the " + std::to_string(units.size()) +
                             " units", rank());
  return units[u];
}

std::vector<Tensor> ShardedUnits::Impl::views(const Unit& unit, const Tensor& flat) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < unit.shapes.size(); ++i)
    out.push_back(flat.flat_slice(unit.offsets[i], shape_numel(unit.shapes[i])).view(unit.shapes[i]));
  return out;
}

void ShardedUnits::Impl::settle_reduction(Unit& unit) {
  if (!unit.reducing.valid()) return;
  in_flight.reset();  // at most one reduction is in flight: this one
  Future<void> f = std::move(unit.reducing);
  unit.reducing = Future<void>();
  Tensor storage = std::move(unit.reduce_storage);
  unit.reduce_storage = Tensor();
  const bool gathered = unit.grads_in_gathered;
  unit.grads_in_gathered = false;
  f.get();
  // Done with it: the next reduction's, or the next gather's when it was a
  // gather buffer (release_for_gradients: the prefetch that follows takes it).
  (gathered ? gather_spares : reduce_spares).assign(1, std::move(storage));
}

Tensor ShardedUnits::Impl::take(std::vector<Tensor>& spares, std::int64_t numel, Tensor& storage) {
  for (auto& spare : spares)
    if (spare.numel() >= numel) {
      storage = std::move(spare);
      spares.clear();
      return storage.numel() == numel ? storage : storage.flat_slice(0, numel);
    }
  spares.clear();
  storage = Tensor::empty({numel});
  return storage;
}

ShardedUnits::ShardedUnits(std::vector<std::vector<Tensor>> units, OptimizerSpec spec, ShardedUnitsOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(std::move(units), std::move(spec), std::move(options));
}

ShardedUnits::ShardedUnits(std::vector<std::vector<Tensor>> units, const OptimizerOptions& optimizer,
                           ShardedUnitsOptions options)
    : ShardedUnits(std::move(units), spec_of(optimizer, kName), std::move(options)) {}

ShardedUnits::~ShardedUnits() {
  if (!impl_) return;
  for (auto& unit : impl_->units) {
    if (unit.gathering.valid()) unit.gathering.wait();
    if (unit.reducing.valid()) unit.reducing.wait();
  }
}

void ShardedUnits::Impl::start_gather(Unit& unit) {
  if (unit.gathered.defined()) return;  // gathered or in flight: nothing to post
  unit.gathered = take(gather_spares, unit.shard_numel * world(), unit.gathered_storage);
  unit.gathering = group.all_gather_into_tensor_async(unit.gathered, unit.shard);
}

Future<std::vector<Tensor>> ShardedUnits::gather_async(std::size_t u) {
  Unit& unit = impl_->unit(u, "ShardedUnits.gather");
  impl_->start_gather(unit);
  return unit.gathering.then([unit_views = Impl::views(unit, unit.gathered)](Future<void> f) {
    f.get();
    return unit_views;
  });
}

std::vector<Tensor> ShardedUnits::gather(std::size_t u) { return gather_async(u).get(); }

Future<void> ShardedUnits::prefetch(std::size_t u) {
  Unit& unit = impl_->unit(u, "ShardedUnits.prefetch");
  impl_->start_gather(unit);
  return unit.gathering;
}

void ShardedUnits::release(std::size_t u) {
  Unit& unit = impl_->unit(u, "ShardedUnits.release");
  if (unit.gathering.valid()) unit.gathering.wait();  // every rank posted it; its error went to gather
  const bool reusable = unit.gathering.valid() && !unit.gathering.exception();
  unit.gathering = Future<void>();
  unit.gathered = Tensor();
  if (reusable) impl_->gather_spares.assign(1, std::move(unit.gathered_storage));
  unit.gathered_storage = Tensor();
}

void ShardedUnits::register_comm_hook(CommHook hook) {
  static constexpr const char* op = "ShardedUnits.register_comm_hook";
  if (impl_->hook) throw StateError(op, "a comm hook is already registered", impl_->rank());
  if (impl_->reduced_once)
    throw StateError(op, "gradients were reduced already (register the hook before the first reduction)",
                     impl_->rank());
  if (!hook) throw ValueError(op, "empty hook", impl_->rank());
  impl_->hook = std::move(hook);
}

Future<void> ShardedUnits::reduce_gradients_async(std::size_t u, const std::vector<Tensor>& grads) {
  static constexpr const char* op = "ShardedUnits.reduce_gradients";
  Impl& im = *impl_;
  Unit& unit = im.unit(u, op);
  const int rank = im.rank(), world = im.world();
  const std::string where = "unit " + std::to_string(u);
  if (unit.reduced)
    throw StateError(op, where + " was reduced already in this iteration (once per unit, then step())", rank);
  if (grads.size() != unit.shapes.size())
    throw ShapeError(op, where + " has " + std::to_string(unit.shapes.size()) + " parameters, got " +
                             std::to_string(grads.size()) + " gradients", rank);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    if (grads[i].shape() != unit.shapes[i])
      throw ShapeError(op, where + " gradient " + std::to_string(i) + " has shape " + shape_str(grads[i].shape()) +
                               ", its parameter " + shape_str(unit.shapes[i]), rank);
    if (grads[i].dtype() != DType::float32 || !grads[i].device().is_cpu())
      throw DTypeError(op, where + " gradient " + std::to_string(i) + " (" + grads[i].str() +
                               ") is not a float32 CPU tensor", rank);
  }
  if (unit.grad_buffer.defined())
    throw StateError(op, where + "'s gradient_buffers are out: reduce them with reduce_gradients(" +
                             std::to_string(u) + ") (without gradients)", rank);
  // One reduction in flight at most: the previous unit's (posted one
  // unit's compute ago) is waited for, and its buffer freed, first.
  if (im.in_flight) im.settle_reduction(im.units[*im.in_flight]);
  Tensor buffer = Impl::take(im.reduce_spares, unit.shard_numel * world, unit.reduce_storage);
  buffer.fill_(0.0);  // the padding and undefined gradients
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) buffer.flat_slice(unit.offsets[i], grads[i].numel()).view(unit.shapes[i]).copy_(grads[i]);
  return im.start_reduction(u, std::move(buffer), op);
}

Future<void> ShardedUnits::Impl::start_reduction(std::size_t u, Tensor buffer, const char* op) {
  Unit& unit = units[u];
  const int rank = this->rank(), world = this->world();
  const std::int64_t s = unit.shard_numel;
  Future<Tensor> reduced;
  if (hook) {
    // The hook's contract returns the whole unit (as a Reducer's bucket);
    // each rank reads back its shard only: the owner segments.
    GradBucket bucket(u, units.size(), buffer, Impl::views(unit, buffer), unit.offsets);
    std::vector<GradBucket::Segment> segments;
    for (int q = 0; q < world; ++q) segments.push_back({q * s, s, q});
    bucket.set_owner_segments(std::move(segments));
    reduced = hook(bucket);
  } else {
    // allreduce_hook's arithmetic: divide, then each shard summed onto its
    // rank in group-rank order (the all_reduce's sums).
    detail::divide_any_(buffer, world, op);
    std::vector<Future<void>> fs;
    for (int q = 0; q < world; ++q) fs.push_back(group.reduce_async(buffer.flat_slice(q * s, s), q, ReduceOp::sum));
    reduced = when_all(fs).then([buffer](Future<void> f) {
      f.get();
      return buffer;
    });
  }
  reduced_once = true;
  unit.reduced = true;
  // The grad tensor is the rank's; the callback writes its values only.
  unit.reducing = reduced.then([grad = unit.shard.grad(), offset = rank * s, s](Future<Tensor> f) {
    grad.copy_(f.get().flat_slice(offset, s));
  });
  in_flight = u;
  return unit.reducing;
}

std::vector<Tensor> ShardedUnits::gradient_buffers(std::size_t u) {
  static constexpr const char* op = "ShardedUnits.gradient_buffers";
  Impl& im = *impl_;
  Unit& unit = im.unit(u, op);
  if (unit.reduced)
    throw StateError(op, "unit " + std::to_string(u) +
                             " was reduced already in this iteration (its buffers are the reduction's until step())",
                     im.rank());
  if (!unit.grad_buffer.defined()) {
    // The reduction in flight holds the spare buffer: wait for it.
    if (im.in_flight) im.settle_reduction(im.units[*im.in_flight]);
    unit.grad_buffer = Impl::take(im.reduce_spares, unit.shard_numel * im.world(), unit.reduce_storage);
    unit.grad_buffer.fill_(0.0);  // the padding and the gradients the caller leaves unwritten
  }
  return Impl::views(unit, unit.grad_buffer);
}

std::vector<Tensor> ShardedUnits::release_for_gradients(std::size_t u) {
  static constexpr const char* op = "ShardedUnits.release_for_gradients";
  Impl& im = *impl_;
  Unit& unit = im.unit(u, op);
  const std::string where = "unit " + std::to_string(u);
  if (unit.reduced)
    throw StateError(
        op, where + " was reduced already in this iteration (its buffers are the reduction's until step())", im.rank());
  if (unit.grad_buffer.defined()) {
    if (unit.grads_in_gathered) return Impl::views(unit, unit.grad_buffer);  // a second call: the same buffer
    throw StateError(op,
                     where +
                         "'s gradient_buffers are out (a buffer of their own): write those, or call "
                         "release_for_gradients(" +
                         std::to_string(u) + ") instead of gradient_buffers",
                     im.rank());
  }
  if (!unit.gathered.defined())
    throw StateError(op,
                     where + " is not gathered (its parameters' memory becomes the gradients': gather(" +
                         std::to_string(u) + ") first, or take gradient_buffers(" + std::to_string(u) + "))",
                     im.rank());
  // The unit is released into its gradients: the gather buffer changes role.
  Future<void> gathering = std::move(unit.gathering);
  unit.gathering = Future<void>();
  Tensor flat = std::move(unit.gathered), storage = std::move(unit.gathered_storage);
  unit.gathered = Tensor();
  unit.gathered_storage = Tensor();
  if (gathering.valid()) {
    gathering.wait();                            // every rank posted it
    if (gathering.exception()) gathering.get();  // its error; the buffer is dropped
  }
  flat.fill_(0.0);  // the padding and the gradients the caller leaves unwritten
  // The reduction in flight (another unit's) gives its buffer to the gathers,
  // so that the prefetch after this call reuses it.
  if (im.in_flight) im.settle_reduction(im.units[*im.in_flight]);
  unit.grad_buffer = std::move(flat);
  unit.reduce_storage = std::move(storage);
  unit.grads_in_gathered = true;
  return Impl::views(unit, unit.grad_buffer);
}

Future<void> ShardedUnits::reduce_gradients_async(std::size_t u) {
  static constexpr const char* op = "ShardedUnits.reduce_gradients";
  Impl& im = *impl_;
  Unit& unit = im.unit(u, op);
  const std::string where = "unit " + std::to_string(u);
  if (unit.reduced)
    throw StateError(op, where + " was reduced already in this iteration (once per unit, then step())", im.rank());
  if (!unit.grad_buffer.defined())
    throw StateError(op,
                     where + " has no gradient_buffers to reduce (call gradient_buffers(" + std::to_string(u) +
                         ") or release_for_gradients(" + std::to_string(u) +
                         ") and write them first, or pass the gradients)",
                     im.rank());
  // Another unit's reduction may be in flight (its buffers were taken
  // before this unit's): one in flight at most.
  if (im.in_flight) im.settle_reduction(im.units[*im.in_flight]);
  Tensor buffer = std::move(unit.grad_buffer);
  unit.grad_buffer = Tensor();
  return im.start_reduction(u, std::move(buffer), op);
}

void ShardedUnits::reduce_gradients(std::size_t u) {
  (void)reduce_gradients_async(u);
  impl_->settle_reduction(impl_->units[u]);
}

void ShardedUnits::reduce_gradients(std::size_t u, const std::vector<Tensor>& grads) {
  (void)reduce_gradients_async(u, grads);
  impl_->settle_reduction(impl_->units[u]);
}

void ShardedUnits::step() {
  static constexpr const char* op = "ShardedUnits.step";
  Impl& im = *impl_;
  std::string missing;
  for (std::size_t u = 0; u < im.units.size(); ++u) {
    im.settle_reduction(im.units[u]);
    if (!im.units[u].reduced) missing += (missing.empty() ? "" : ", ") + std::to_string(u);
  }
  if (!missing.empty())
    throw StateError(op, "unit(s) " + missing + " have no reduced gradients in this iteration "
                         "(reduce_gradients of every unit before step)", im.rank());
  // Gathered units hold the old values: drop them, the next gather fetches the new.
  for (std::size_t u = 0; u < im.units.size(); ++u) release(u);
  im.gather_spares.clear();
  im.reduce_spares.clear();
  im.optim->step();
  for (auto& unit : im.units) unit.reduced = false;
}

std::size_t ShardedUnits::num_units() const noexcept { return impl_->units.size(); }
std::int64_t ShardedUnits::unit_numel(std::size_t u) const { return impl_->unit(u, "ShardedUnits.unit_numel").numel; }
std::int64_t ShardedUnits::shard_numel(std::size_t u) const {
  return impl_->unit(u, "ShardedUnits.shard_numel").shard_numel;
}
const Tensor& ShardedUnits::shard(std::size_t u) const { return impl_->unit(u, "ShardedUnits.shard").shard; }

std::int64_t ShardedUnits::bytes() const {
  std::int64_t b = 0;
  for (const auto& unit : impl_->units) {
    b += static_cast<std::int64_t>(unit.shard.nbytes());
    if (unit.shard.grad().defined()) b += static_cast<std::int64_t>(unit.shard.grad().nbytes());
  }
  for (const auto& [key, st] : impl_->optim->state())
    for (const auto& [name, t] : st)
      if (t.defined()) b += static_cast<std::int64_t>(t.nbytes());
  return b;
}

std::int64_t ShardedUnits::gathered_bytes() const {
  std::int64_t b = 0;
  for (const auto& unit : impl_->units)
    if (unit.gathered_storage.defined()) b += static_cast<std::int64_t>(unit.gathered_storage.nbytes());
  for (const auto& spare : impl_->gather_spares) b += static_cast<std::int64_t>(spare.nbytes());
  return b;
}

std::int64_t ShardedUnits::buffer_bytes() const {
  std::int64_t b = gathered_bytes();
  for (const auto& unit : impl_->units)
    if (unit.reduce_storage.defined()) b += static_cast<std::int64_t>(unit.reduce_storage.nbytes());
  for (const auto& spare : impl_->reduce_spares) b += static_cast<std::int64_t>(spare.nbytes());
  return b;
}

Optimizer& ShardedUnits::optim() noexcept { return *impl_->optim; }
const Optimizer& ShardedUnits::optim() const noexcept { return *impl_->optim; }
const ProcessGroup& ShardedUnits::process_group() const noexcept { return impl_->group; }
int ShardedUnits::rank() const noexcept { return impl_->rank(); }
int ShardedUnits::world_size() const noexcept { return impl_->world(); }

}  // namespace dopt::optim
