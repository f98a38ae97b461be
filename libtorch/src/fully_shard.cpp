// FullyShard (fully_shard.hpp): ZeRO stage 3 for torch::nn::Module units,
// the port of python/dopt/fully_shard.py to libtorch's C++ autograd: the
// units' flat buffers whose storage points at ShardedUnits' gathered memory
// (or at nothing), the hooks (the output's gradient, the AccumulateGrad
// nodes, the engine's end-of-backward callback) and the calls they make.
// Rank thread only (the backward's hooks run on it too).
#include "dopt/libtorch/fully_shard.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "dopt/libtorch/interop.hpp"
#include "dopt/runtime/error.hpp"

namespace dopt::libtorch {
namespace {

void drop_tensor(void* ctx) { delete static_cast<Tensor*>(ctx); }

/// The flat buffer's storage over `memory` (a dopt tensor whose memory it
/// keeps alive) of `nbytes`, or over nothing (size 0) when memory is undefined.
void point_storage(const at::Tensor& flat, const Tensor& memory, std::size_t nbytes) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  if (!memory.defined()) {
    s->set_data_ptr_noswap(at::DataPtr(nullptr, at::Device(at::kCPU)));
    s->set_nbytes(0);
    return;
  }
  auto* keep = new Tensor(memory);
  s->set_data_ptr_noswap(at::DataPtr(keep->data_ptr(), keep, &drop_tensor, at::Device(at::kCPU)));
  s->set_nbytes(nbytes);
}

bool valid(BackwardPrefetch p) {
  return p == BackwardPrefetch::before_backward || p == BackwardPrefetch::after_gradients;
}

/// "before_backward", "after_gradients", or "7 (not a BackwardPrefetch)".
std::string prefetch_name(std::int64_t v) {
  switch (static_cast<BackwardPrefetch>(v)) {
    case BackwardPrefetch::before_backward:
      return "before_backward";
    case BackwardPrefetch::after_gradients:
      return "after_gradients";
  }
  return std::to_string(v) + " (not a BackwardPrefetch)";
}

/// "rank 5" / "ranks 0-2, 4" (ascending ranks).
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (i ? ", " : "") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return out;
}

}  // namespace

struct FullyShard::Impl : std::enable_shared_from_this<Impl> {
  struct Unit {
    std::shared_ptr<torch::nn::Module> module;
    std::vector<at::Tensor> params;  // the torch parameters (views of `flat` while live, else empty)
    std::vector<at::Tensor> views;   // of `flat`, the parameters' shapes
    at::Tensor flat;                 // its storage: the gathered memory, or nothing
    std::int64_t numel = 0;
    std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept: the hooks are on them
    std::vector<std::uintptr_t> hook_keys;
    bool live = false;       // the parameters are views of the gathered memory
    bool in_flight = false;  // prefetched, not yet gathered
    bool reduced = false;    // reduced in this iteration
    std::size_t ready = 0;   // parameters whose gradient arrived in this backward
  };

  std::unique_ptr<optim::ShardedUnits> model;
  std::vector<Unit> units;
  std::vector<std::size_t> order;  // the units in forward order (the first forward's)
  std::vector<std::ptrdiff_t> place;  // unit -> its index in `order` (-1: not yet run)
  std::unordered_map<const torch::nn::Module*, std::size_t> unit_of;  // module -> unit
  bool order_fixed = false;
  bool in_backward = false;
  bool backward_done = false;  // a backward ended since the last step
  Future<void> reducing;
  int rank = 0;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::before_backward;

  void init(std::vector<std::shared_ptr<torch::nn::Module>> modules, optim::OptimizerSpec spec,
            FullyShardOptions options);
  /// Collective (one all_gather of one word): ValueError on every rank when
  /// the ranks' backward_prefetch differ, naming each rank's.
  void agree_backward_prefetch(ProcessGroup group, const char* op) const;
  Unit& unit(std::size_t u, const char* op);
  std::optional<std::size_t> neighbour(std::size_t u, int step) const;
  void gather(std::size_t u);
  void prefetch(std::optional<std::size_t> u);
  void release(std::size_t u);
  void reduce(std::size_t u);
  void reduce_in_gathered(std::size_t u);
  void begin_backward(std::size_t u);
  void before_backward(std::size_t u);
  void grad_ready(std::size_t u);
  void after_backward();
  [[noreturn]] void second_backward(std::size_t u) const;
};

namespace {

/// On a parameter's AccumulateGrad node: runs `ready` after the gradient is stored.
struct GradReady : torch::autograd::FunctionPostHook {
  explicit GradReady(std::function<void()> ready) : ready(std::move(ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ready();
    return outputs;
  }
  std::function<void()> ready;
};

}  // namespace

void FullyShard::Impl::agree_backward_prefetch(ProcessGroup group, const char* op) const {
  // One all_gather of one word per rank: the ranks' values, by group rank.
  const int world = group.size();
  Tensor all = Tensor::zeros({static_cast<std::int64_t>(world)}, DType::int64);
  group.all_gather_into_tensor(
      all, Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(backward_prefetch)}));
  const std::vector<std::int64_t> values = all.to_vector<std::int64_t>();
  if (std::all_of(values.begin(), values.end(), [&](std::int64_t v) { return v == values.front(); })) return;
  // "rank 0 passes before_backward, ranks 1-2 pass after_gradients": each value with its ranks, by first rank.
  std::vector<std::int64_t> seen;
  std::string each;
  for (std::size_t first = 0; first < values.size(); ++first) {
    if (std::find(seen.begin(), seen.end(), values[first]) != seen.end()) continue;
    seen.push_back(values[first]);
    std::vector<int> ranks;
    for (std::size_t k = first; k < values.size(); ++k)
      if (values[k] == values[first]) ranks.push_back(static_cast<int>(k));
    each += (each.empty() ? "" : ", ") + rank_list(ranks) + (ranks.size() == 1 ? " passes " : " pass ") +
            prefetch_name(values[first]);
  }
  throw ValueError(op,
                   "backward_prefetch differs between the ranks of the process group: " + each +
                       "; pass the same FullyShardOptions::backward_prefetch on every rank (it decides when each "
                       "rank posts the backward's all_gathers and how many unit buffers it holds)",
                   rank);
}

void FullyShard::Impl::init(std::vector<std::shared_ptr<torch::nn::Module>> modules, optim::OptimizerSpec spec,
                            FullyShardOptions options) {
  static constexpr const char* op = "FullyShard";
  std::optional<int> r;
  if (options.process_group.valid()) r = rank = options.process_group.rank();
  backward_prefetch = options.backward_prefetch;
  if (modules.empty()) throw ValueError(op, "no units", r);
  std::unordered_map<const c10::TensorImpl*, std::size_t> owner;
  std::vector<std::vector<Tensor>> shards;
  for (std::size_t u = 0; u < modules.size(); ++u) {
    const std::string where = "unit " + std::to_string(u);
    if (!modules[u]) throw ValueError(op, where + " is a null module", r);
    Unit unit;
    unit.module = modules[u];
    for (const auto& p : modules[u]->parameters()) {
      if (!p.requires_grad()) continue;  // frozen: stays whole, in no unit
      auto [it, fresh] = owner.emplace(p.unsafeGetTensorImpl(), u);
      if (!fresh)
        throw ValueError(op, where + " (" + modules[u]->name() + ") shares a parameter with unit " +
                                 std::to_string(it->second) + " (a parameter belongs to one unit)", r);
      if (p.scalar_type() != at::kFloat || !p.device().is_cpu())
        throw TypeError(op, where + " (" + modules[u]->name() + ") has a " + std::string(c10::toString(p.scalar_type())) +
                                " parameter on " + p.device().str() + " (float32 CPU parameters only)", r);
      unit.params.push_back(p);
      unit.numel += p.numel();
    }
    if (unit.params.empty())
      throw ValueError(op, where + " (" + modules[u]->name() + ") has no trainable parameters", r);
    shards.emplace_back();
    for (const auto& p : unit.params) shards.back().push_back(to_dopt(p.detach().contiguous()));
    unit_of[unit.module.get()] = units.size();
    units.push_back(std::move(unit));
  }
  place.assign(units.size(), -1);
  if (options.process_group.valid()) agree_backward_prefetch(options.process_group, op);
  if (!valid(backward_prefetch))
    throw ValueError(op,
                     "backward_prefetch " + std::to_string(static_cast<int>(backward_prefetch)) +
                         " is not a BackwardPrefetch (before_backward or after_gradients)",
                     r);
  optim::ShardedUnitsOptions sharded = std::move(options);
  model = std::make_unique<optim::ShardedUnits>(std::move(shards), std::move(spec), std::move(sharded));
  rank = model->rank();
  torch::AutoGradMode grad_on(true);
  for (std::size_t u = 0; u < units.size(); ++u) {
    Unit& unit = units[u];
    unit.flat = at::empty({unit.numel}, at::kFloat);
    std::int64_t at = 0;
    for (const auto& p : unit.params) {
      unit.views.push_back(unit.flat.narrow(0, at, p.numel()).view(p.sizes()));
      at += p.numel();
      // Made while p has its shape: autograd checks the gradients against it.
      auto acc = torch::autograd::impl::grad_accumulator(p);
      unit.hook_keys.push_back(acc->add_post_hook(std::make_unique<GradReady>([weak = weak_from_this(), u] {
        if (auto im = weak.lock()) im->grad_ready(u);
      })));
      unit.accumulators.push_back(std::move(acc));
      p.set_data(at::empty({0}, at::kFloat));
      p.mutable_grad().reset();
    }
    point_storage(unit.flat, Tensor(), 0);
  }
}

FullyShard::Impl::Unit& FullyShard::Impl::unit(std::size_t u, const char* op) {
  if (u >= units.size())
    throw ValueError(op, "unit " + std::to_string(u) + " is not one of the " + std::to_string(units.size()) + " units",
                     rank);
  return units[u];
}

std::optional<std::size_t> FullyShard::Impl::neighbour(std::size_t u, int step) const {
  if (!order_fixed) return std::nullopt;
  if (place[u] < 0) return std::nullopt;
  const auto i = place[u] + step;
  if (i < 0 || i >= static_cast<std::ptrdiff_t>(order.size())) return std::nullopt;
  return order[static_cast<std::size_t>(i)];
}

void FullyShard::Impl::gather(std::size_t u) {
  Unit& unit = units[u];
  if (unit.live) return;
  const std::vector<Tensor> full = model->gather(u);  // waits for its prefetch
  unit.in_flight = false;
  // The views of one gathered buffer, flattened in order: the flat buffer is its start.
  point_storage(unit.flat, full.front(), static_cast<std::size_t>(unit.numel) * sizeof(float));
  for (std::size_t i = 0; i < unit.params.size(); ++i) {
    if (full[i].data_ptr() != unit.views[i].data_ptr())
      throw StateError("FullyShard.gather", "unit " + std::to_string(u) + " parameter " + std::to_string(i) +
                                                " is not where the flat layout puts it in ShardedUnits' buffer",
                       rank);
    unit.params[i].set_data(unit.views[i]);
  }
  unit.live = true;
}

void FullyShard::Impl::prefetch(std::optional<std::size_t> u) {
  if (!u) return;
  Unit& unit = units[*u];
  if (unit.live || unit.in_flight || unit.reduced) return;
  (void)model->prefetch(*u);
  unit.in_flight = true;
}

void FullyShard::Impl::release(std::size_t u) {
  Unit& unit = units[u];
  if (unit.in_flight) {
    model->release(u);  // waits for the all_gather
    unit.in_flight = false;
  }
  if (!unit.live) return;
  for (auto& p : unit.params) p.set_data(at::empty({0}, at::kFloat));
  point_storage(unit.flat, Tensor(), 0);  // before ShardedUnits reuses the memory
  model->release(u);
  unit.live = false;
}

void FullyShard::Impl::reduce(std::size_t u) {
  Unit& unit = units[u];
  std::vector<Tensor> grads;
  for (const auto& p : unit.params) {
    const at::Tensor& g = p.grad();
    grads.push_back(g.defined() ? to_dopt(g.detach().contiguous()) : Tensor());
  }
  reducing = model->reduce_gradients_async(u, grads);  // copies them
  unit.reduced = true;
  for (auto& p : unit.params) p.mutable_grad().reset();
}

void FullyShard::Impl::reduce_in_gathered(std::size_t u) {
  Unit& unit = units[u];
  std::vector<at::Tensor> grads;
  for (auto& p : unit.params) {
    grads.push_back(p.grad().defined() ? p.grad().detach().contiguous() : at::Tensor());
    p.mutable_grad().reset();
    p.set_data(at::empty({0}, at::kFloat));
  }
  point_storage(unit.flat, Tensor(), 0);  // torch lets go of the memory before it turns into gradients
  unit.live = false;
  // The unit's gathered memory, zeroed, in the parameters' shapes; the
  // reduction in flight (the next unit's) gives its buffer to the prefetch
  // (after_gradients; before_backward posted it already).
  const std::vector<Tensor> views = model->release_for_gradients(u);
  prefetch(neighbour(u, -1));
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) views[i].copy_(to_dopt(grads[i]));
  grads.clear();
  reducing = model->reduce_gradients_async(u);  // in place
  unit.reduced = true;
}

void FullyShard::Impl::second_backward(std::size_t u) const {
  throw StateError("FullyShard.backward",
                   "a second backward before step() (unit " + std::to_string(u) +
                       "'s gradients were reduced already in this iteration); FullyShard takes one backward per step",
                   rank);
}

void FullyShard::Impl::begin_backward(std::size_t u) {
  if (in_backward) return;
  for (const auto& unit : units)
    if (unit.reduced) second_backward(u);
  in_backward = true;
  order_fixed = true;
  torch::autograd::Engine::get_default_engine().queue_callback([weak = weak_from_this()] {
    if (auto im = weak.lock()) im->after_backward();
  });
}

void FullyShard::Impl::before_backward(std::size_t u) {
  begin_backward(u);
  if (units[u].reduced) return;
  gather(u);
  // The unit before: now, overlapping u's backward (three unit buffers), or
  // once u's gradients took u's memory (grad_ready: two).
  if (backward_prefetch == BackwardPrefetch::before_backward) prefetch(neighbour(u, -1));
}

void FullyShard::Impl::grad_ready(std::size_t u) {
  begin_backward(u);
  Unit& unit = units[u];
  if (unit.reduced) second_backward(u);
  if (++unit.ready != unit.params.size()) return;
  if (unit.live) {
    reduce_in_gathered(u);
  } else {  // gradients that came without the unit's gather (its output's hook did not run): copied
    reduce(u);
    release(u);
    prefetch(neighbour(u, -1));
  }
}

void FullyShard::Impl::after_backward() {
  in_backward = false;
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (!units[u].reduced) reduce(u);  // not reached by this backward: its gradients as they are (none: zeros)
    units[u].ready = 0;
  }
  if (reducing.valid()) {
    Future<void> last = std::move(reducing);
    reducing = Future<void>();
    last.get();
  }
  for (std::size_t u = 0; u < units.size(); ++u) release(u);
  backward_done = true;
}

FullyShard::FullyShard(std::vector<std::shared_ptr<torch::nn::Module>> units, optim::OptimizerSpec spec,
                       FullyShardOptions options)
    : impl_(std::make_shared<Impl>()) {
  impl_->init(std::move(units), std::move(spec), std::move(options));
}

FullyShard::FullyShard(std::vector<std::shared_ptr<torch::nn::Module>> units, const optim::OptimizerOptions& optimizer,
                       FullyShardOptions options)
    : FullyShard(std::move(units), optim::spec_of(optimizer, "FullyShard"), std::move(options)) {}

FullyShard::~FullyShard() {
  if (!impl_) return;
  for (auto& unit : impl_->units) {
    for (std::size_t i = 0; i < unit.accumulators.size(); ++i) unit.accumulators[i]->del_post_hook(unit.hook_keys[i]);
    if (unit.live)
      for (auto& p : unit.params) p.set_data(at::empty({0}, at::kFloat));
    point_storage(unit.flat, Tensor(), 0);
  }
  if (impl_->reducing.valid()) impl_->reducing.wait();
}

at::Tensor FullyShard::forward(std::size_t u, const std::function<at::Tensor()>& fn) {
  static constexpr const char* op = "FullyShard.forward";
  Impl& im = *impl_;
  (void)im.unit(u, op);
  if (im.in_backward)
    throw StateError(op, "unit " + std::to_string(u) + ": forward inside a backward (not supported)", im.rank);
  if (!im.order_fixed && im.place[u] < 0) {
    im.place[u] = static_cast<std::ptrdiff_t>(im.order.size());
    im.order.push_back(u);
  }
  im.gather(u);
  im.prefetch(im.neighbour(u, 1));
  at::Tensor out;
  try {
    out = fn();
  } catch (...) {
    im.release(u);
    throw;
  }
  im.release(u);
  if (at::GradMode::is_enabled() && out.defined() && out.requires_grad())
    out.register_hook([weak = im.weak_from_this(), u](const at::Tensor&) {
      if (auto p = weak.lock()) p->before_backward(u);
    });
  return out;
}

at::Tensor FullyShard::forward(torch::nn::Sequential net, at::Tensor x) {
  for (auto& child : *net) {
    const auto it = impl_->unit_of.find(child.ptr().get());
    if (it != impl_->unit_of.end())
      x = forward(it->second, [&] { return child.forward(x); });
    else
      x = child.forward(x);
  }
  return x;
}

void FullyShard::step() {
  static constexpr const char* op = "FullyShard.step";
  Impl& im = *impl_;
  if (im.in_backward) throw StateError(op, "inside a backward", im.rank);
  if (!im.backward_done)
    throw StateError(op, "no backward since the last step (each iteration: forward, backward, then step)", im.rank);
  im.model->step();
  for (auto& unit : im.units) unit.reduced = false;
  im.backward_done = false;
}

StateDict FullyShard::state_dict() { return impl_->model->state_dict(); }

void FullyShard::load_state_dict(const StateDict& sd) { impl_->model->load_state_dict(sd); }

std::vector<at::Tensor> FullyShard::full_parameters() {
  std::vector<at::Tensor> out;
  for (const auto& t : impl_->model->full_parameters()) out.push_back(to_torch(t));
  return out;
}

void FullyShard::load_full_parameters(const std::vector<at::Tensor>& full) {
  static constexpr const char* op = "FullyShard.load_full_parameters";
  Impl& im = *impl_;
  if (im.in_backward) throw StateError(op, "inside a backward", im.rank);
  for (std::size_t u = 0; u < im.units.size(); ++u) im.release(u);
  std::vector<Tensor> values;
  for (const auto& t : full) values.push_back(to_dopt(t.detach().to(at::kFloat).contiguous()));
  im.model->load_parameters(values);
}

std::vector<at::Tensor> FullyShard::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& unit : impl_->units) out.insert(out.end(), unit.params.begin(), unit.params.end());
  return out;
}

std::size_t FullyShard::num_units() const noexcept { return impl_->units.size(); }
std::int64_t FullyShard::bytes() const { return impl_->model->bytes(); }
std::int64_t FullyShard::gathered_bytes() const { return impl_->model->gathered_bytes(); }
optim::ShardedUnits& FullyShard::sharded() noexcept { return *impl_->model; }
int FullyShard::rank() const noexcept { return impl_->rank; }
BackwardPrefetch FullyShard::backward_prefetch() const noexcept { return impl_->backward_prefetch; }

}  // namespace dopt::libtorch
