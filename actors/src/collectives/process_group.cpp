#include "dopt/actors/process_group.hpp"
#include "collectives/access.hpp"

#include <algorithm>
#include <functional>
#include <set>

#include "collectives/group.hpp"
#include "dopt/actors/internal/call_label.hpp"
#include "dopt/actors/internal/device_plane.hpp"
#include "dopt/actors/internal/sim_hooks.hpp"
#include "sim/p2p.hpp"

namespace dopt {

std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::product: return "product";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
  }
  return "?";
}

namespace detail {

const char* coll_name(CollKind k) noexcept {
  switch (k) {
    case CollKind::broadcast: return "broadcast";
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::reduce: return "reduce";
    case CollKind::all_gather: return "all_gather";
    case CollKind::all_gather_flat: return "all_gather_into_tensor";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::barrier: return "barrier";
    case CollKind::new_group: return "new_group";
    case CollKind::send: return "send";
    case CollKind::recv: return "recv";
    case CollKind::all_reduce_coalesced: return "all_reduce_coalesced";
    case CollKind::broadcast_coalesced: return "broadcast_coalesced";
  }
  return "?";
}

std::string CollDesc::str() const {
  std::string s = coll_name(kind);
  s += "(";
  bool first = true;
  auto add = [&](const std::string& part) {
    if (!first) s += ", ";
    s += part;
    first = false;
  };
  if (has_op()) add(std::string(reduce_op_name(op)));
  if (root >= 0) {
    const char* what = kind == CollKind::broadcast || kind == CollKind::broadcast_coalesced ? "src " : "dst ";
    add(what + std::to_string(root));
  }
  if (has_tensor()) {
    add(std::string(dtype_name(dtype)));
    add(shape_str(shape));
  }
  if (!extra.empty()) add(extra);
  s += ")";
  return s;
}

}  // namespace detail

namespace {

using detail::CollKind;
using detail::GroupImpl;
using detail::Op;

std::string op_label(CollKind k) { return std::string("ProcessGroup.") + detail::coll_name(k); }

/// Defined, and on the CPU or on a device with a registered plane.
void check_tensor(const Tensor& t, CollKind k, const char* what) {
  std::string op = op_label(k);
  if (!t.defined()) throw ValueError(op, std::string(what) + " is undefined");
  if (!t.device().is_cpu() && !detail::device_plane_factory(t))
    throw DeviceError(op, std::string(what) + " is on " + t.device().str() +
                              "; only CPU tensors are supported by this backend (no plane is registered for " +
                              t.device().str() + ")");
}

/// The call's tensors all on one device (the plane is chosen by it).
void check_one_device(const std::vector<Tensor>& ts, CollKind k) {
  for (std::size_t i = 1; i < ts.size(); ++i)
    if (ts[i].device() != ts[0].device())
      throw DeviceError(op_label(k), "the call's tensors are on " + ts[0].device().str() + " and " +
                                         ts[i].device().str() + "; a collective runs on one device");
}

void check_reducible(const Tensor& t, ReduceOp rop, CollKind k) {
  if (t.dtype() == DType::bool_)
    throw DTypeError(op_label(k), "reductions do not support bool tensors");
  if (rop == ReduceOp::avg && !is_floating_point(t.dtype()))
    throw DTypeError(op_label(k), "ReduceOp avg needs a floating point tensor, got " +
                                      std::string(dtype_name(t.dtype())));
}

void check_same(const Tensor& ref, const Tensor& t, CollKind k, const std::string& what) {
  if (t.dtype() != ref.dtype())
    throw DTypeError(op_label(k), what + " has dtype " + std::string(dtype_name(t.dtype())) +
                                      ", expected " + std::string(dtype_name(ref.dtype())));
  if (t.numel() != ref.numel() || t.shape() != ref.shape())
    throw ShapeError(op_label(k),
                     what + " has shape " + shape_str(t.shape()) + ", expected " + shape_str(ref.shape()));
}

void check_rank(int r, int size, CollKind k, const char* what) {
  if (r < 0 || r >= size)
    throw ValueError(op_label(k), std::string(what) + " " + std::to_string(r) +
                                      " is out of range for a group of size " + std::to_string(size));
}

/// {mine, per_rank...} after checking that per_rank has one tensor per group
/// rank (`name` + "s[i]"), each like `mine` (dtype and shape).
std::vector<Tensor> with_one_per_rank(const Tensor& mine, const std::vector<Tensor>& per_rank, int size, CollKind k,
                                      const std::string& name) {
  if (static_cast<int>(per_rank.size()) != size)
    throw ValueError(op_label(k), "got " + std::to_string(per_rank.size()) + " " + name +
                                      " tensors for a group of size " + std::to_string(size));
  std::vector<Tensor> ts{mine};
  for (std::size_t i = 0; i < per_rank.size(); ++i) {
    const std::string what = name + "s[" + std::to_string(i) + "]";
    check_tensor(per_rank[i], k, what.c_str());
    check_same(mine, per_rank[i], k, what);
    ts.push_back(per_rank[i]);
  }
  return ts;
}

/// The public call that issues a call of kind k now: the thread's CallScope,
/// else the ProcessGroup method.
std::string caller_of(CollKind k) {
  if (const char* c = detail::current_call()) return c;
  return std::string("ProcessGroup::") + detail::coll_name(k) + "()";
}

/// The call, numbered: calls on device tensors apart from those on CPU ones
/// (GroupImpl::next_device_seq).
std::shared_ptr<Op> make_op(GroupImpl& g, detail::CollDesc desc, std::vector<Tensor> tensors) {
  check_one_device(tensors, desc.kind);
  desc.caller = caller_of(desc.kind);
  auto op = std::make_shared<Op>();
  op->gid = g.gid;
  op->members = g.members;
  op->my_grank = g.my_grank;
  op->desc = std::move(desc);
  op->tensors = std::move(tensors);
  op->timeout = std::chrono::milliseconds(g.timeout_ms.load());
  const bool on_device = !op->tensors.empty() && !op->tensors[0].device().is_cpu();
  op->seq = (on_device ? g.next_device_seq : g.next_seq).fetch_add(1);
  return op;
}

detail::CollDesc desc_of(CollKind k, const Tensor& t, int root = -1, ReduceOp rop = ReduceOp::sum) {
  detail::CollDesc d;
  d.kind = k;
  d.op = rop;
  d.dtype = t.dtype();
  d.shape = t.shape();
  d.root = root;
  return d;
}

/// A send (k == send) or recv with group rank `peer` (checked: in range, not
/// this rank), numbered per (peer, tag) apart from the collectives.
std::shared_ptr<Op> make_p2p_op(GroupImpl& g, CollKind k, const Tensor& tensor, int peer, int tag) {
  const bool send = k == CollKind::send;
  check_tensor(tensor, k, "tensor");
  check_rank(peer, static_cast<int>(g.members->size()), k, send ? "dst" : "src");
  if (peer == g.my_grank)
    throw ValueError(op_label(k), send ? "a rank cannot send to itself" : "a rank cannot receive from itself");
  auto op = std::make_shared<Op>();
  op->gid = g.gid;
  op->members = g.members;
  op->my_grank = g.my_grank;
  op->desc = desc_of(k, tensor);
  op->desc.caller = caller_of(k);
  op->tensors = {tensor};
  op->timeout = std::chrono::milliseconds(g.timeout_ms.load());
  op->peer = (*g.members)[static_cast<std::size_t>(peer)];
  op->tag = tag;
  {
    std::lock_guard<std::mutex> lock(g.p2p_mutex);
    op->seq = (send ? g.send_seq : g.recv_seq)[{op->peer, tag, !tensor.device().is_cpu()}]++;
  }
  return op;
}

void wait_blocking(const Future<void>& f) {
  if (f.valid()) f.get();
}

/// The plane that runs op: for tensors on a device, the group's plane for
/// that device (made on first use; NotSupportedError for a call it does not
/// run); for CPU tensors the group's plane, null when it does not run the
/// call (the rank actor does).
std::shared_ptr<detail::GroupPlane> plane_for(const ProcessGroup& pg, GroupImpl& g, const Op& op) {
  if (!op.tensors.empty() && !op.tensors[0].device().is_cpu()) {
    const std::string label = op_label(op.desc.kind);
    auto plane = detail::device_plane(pg, g, op.tensors[0], label.c_str());
    if (!plane->supports(op.desc))
      throw NotSupportedError(label, std::string("the ") + plane->name() + " plane does not run " +
                                         detail::coll_name(op.desc.kind) + " on " + op.tensors[0].device().str() +
                                         " tensors");
    return plane;
  }
  if (g.plane && g.plane->supports(op.desc)) return g.plane;
  return nullptr;
}

/// Where every call meets its plane: blocking, it returns once op is done
/// (on the shared-memory plane without a thread hand-off); otherwise with
/// op's future.
Future<void> submit(const ProcessGroup& pg, GroupImpl& g, std::shared_ptr<Op> op, bool blocking) {
  if (auto plane = plane_for(pg, g, *op)) {
    if (!blocking) return plane->run_async(op);
    plane->run(op);
    return Future<void>();
  }
  auto fut = op->promise.get_future();
  g.endpoint->post(std::move(op));
  if (!blocking) return fut;
  fut.get();
  return Future<void>();
}

}  // namespace

detail::GroupImpl& ProcessGroup::member(const char* op) const {
  if (!impl_) throw StateError(op, "the process group is invalid (default-constructed)");
  if (impl_->my_grank < 0)
    throw StateError(op, "this rank is not a member of group " + std::to_string(impl_->gid));
  return *impl_;
}

bool ProcessGroup::is_member() const { return impl_ && impl_->my_grank >= 0; }
int ProcessGroup::rank() const { return impl_ ? impl_->my_grank : -1; }
int ProcessGroup::size() const { return impl_ ? static_cast<int>(impl_->members->size()) : 0; }
const std::vector<int>& ProcessGroup::ranks() const {
  static const std::vector<int> none;
  return impl_ ? *impl_->members : none;
}
int ProcessGroup::global_rank(int group_rank) const {
  if (!impl_ || group_rank < 0 || group_rank >= size())
    throw ValueError("ProcessGroup.global_rank", "group rank " + std::to_string(group_rank) +
                                                     " is out of range for a group of size " +
                                                     std::to_string(size()));
  return (*impl_->members)[static_cast<std::size_t>(group_rank)];
}
int ProcessGroup::group_rank(int global) const {
  if (!impl_) return -1;
  auto& m = *impl_->members;
  auto it = std::lower_bound(m.begin(), m.end(), global);
  return (it != m.end() && *it == global) ? static_cast<int>(it - m.begin()) : -1;
}
std::uint64_t ProcessGroup::id() const { return impl_ ? impl_->gid : 0; }
std::chrono::milliseconds ProcessGroup::timeout() const {
  return std::chrono::milliseconds(impl_ ? impl_->timeout_ms.load() : 0);
}
PlaneStats ProcessGroup::plane_stats() const {
  if (!impl_) return {};
  if (!impl_->plane) return PlaneStats{"actor", 0};
  return PlaneStats{impl_->plane->name(), impl_->plane->bytes_to_other_hosts(),
                    impl_->plane->bytes_read_from_host_peers()};
}

void ProcessGroup::set_timeout(std::chrono::milliseconds timeout) {
  if (!impl_) throw StateError("ProcessGroup.set_timeout", "the process group is invalid");
  if (timeout.count() <= 0)
    throw ValueError("ProcessGroup.set_timeout",
                     "timeout must be positive, got " + std::to_string(timeout.count()) + " ms");
  impl_->timeout_ms.store(timeout.count());
}

// Every collective: the async form and the blocking one share one body,
// `blocking` selects how the call is handed over (submit()).

Future<void> ProcessGroup::broadcast_impl(const Tensor& tensor, int src, bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::broadcast()" : "ProcessGroup::broadcast_async()");
  auto& g = member("ProcessGroup.broadcast");
  check_tensor(tensor, CollKind::broadcast, "tensor");
  check_rank(src, size(), CollKind::broadcast, "src");
  return submit(*this, g, make_op(g, desc_of(CollKind::broadcast, tensor, src), {tensor}), blocking);
}

Future<void> ProcessGroup::all_reduce_impl(const Tensor& tensor, ReduceOp op, bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::all_reduce()" : "ProcessGroup::all_reduce_async()");
  auto& g = member("ProcessGroup.all_reduce");
  check_tensor(tensor, CollKind::all_reduce, "tensor");
  check_reducible(tensor, op, CollKind::all_reduce);
  return submit(*this, g, make_op(g, desc_of(CollKind::all_reduce, tensor, -1, op), {tensor}), blocking);
}

Future<void> ProcessGroup::reduce_impl(const Tensor& tensor, int dst, ReduceOp op, bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::reduce()" : "ProcessGroup::reduce_async()");
  auto& g = member("ProcessGroup.reduce");
  check_tensor(tensor, CollKind::reduce, "tensor");
  check_reducible(tensor, op, CollKind::reduce);
  check_rank(dst, size(), CollKind::reduce, "dst");
  return submit(*this, g, make_op(g, desc_of(CollKind::reduce, tensor, dst, op), {tensor}), blocking);
}

Future<void> ProcessGroup::all_gather_impl(const std::vector<Tensor>& outputs, const Tensor& input, bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::all_gather()" : "ProcessGroup::all_gather_async()");
  auto& g = member("ProcessGroup.all_gather");
  const CollKind k = CollKind::all_gather;
  check_tensor(input, k, "input");
  return submit(*this, g, make_op(g, desc_of(k, input), with_one_per_rank(input, outputs, size(), k, "output")),
                blocking);
}

Future<void> ProcessGroup::all_gather_into_tensor_impl(const Tensor& output, const Tensor& input, bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::all_gather_into_tensor()"
                                   : "ProcessGroup::all_gather_into_tensor_async()");
  auto& g = member("ProcessGroup.all_gather_into_tensor");
  const CollKind k = CollKind::all_gather_flat;
  check_tensor(input, k, "input");
  check_tensor(output, k, "output");
  if (output.dtype() != input.dtype())
    throw DTypeError(op_label(k), "output has dtype " + std::string(dtype_name(output.dtype())) +
                                      ", input has " + std::string(dtype_name(input.dtype())));
  if (output.numel() != input.numel() * size())
    throw ShapeError(op_label(k), "output has " + std::to_string(output.numel()) +
                                      " elements, expected group size " + std::to_string(size()) +
                                      " x " + std::to_string(input.numel()));
  return submit(*this, g, make_op(g, desc_of(k, input), {input, output}), blocking);
}

Future<void> ProcessGroup::reduce_scatter_impl(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op,
                                               bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::reduce_scatter()" : "ProcessGroup::reduce_scatter_async()");
  auto& g = member("ProcessGroup.reduce_scatter");
  const CollKind k = CollKind::reduce_scatter;
  check_tensor(output, k, "output");
  check_reducible(output, op, k);
  auto tensors = with_one_per_rank(output, inputs, size(), k, "input");
  return submit(*this, g, make_op(g, desc_of(k, output, -1, op), std::move(tensors)), blocking);
}

Future<void> ProcessGroup::barrier_impl(bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::barrier()" : "ProcessGroup::barrier_async()");
  auto& g = member("ProcessGroup.barrier");
  detail::CollDesc d;
  d.kind = CollKind::barrier;
  return submit(*this, g, make_op(g, d, {}), blocking);
}

namespace {

/// "[2, 3] [4]": the shapes of a coalesced call (every rank must agree).
std::string shapes_str(const std::vector<Tensor>& ts) {
  std::string s;
  for (const auto& t : ts) s += (s.empty() ? "" : " ") + shape_str(t.shape());
  return s;
}

}  // namespace

Future<void> ProcessGroup::all_reduce_coalesced_impl(const std::vector<Tensor>& tensors,
                                                     const AllReduceCoalescedOptions& options, bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::all_reduce_coalesced()"
                                   : "ProcessGroup::all_reduce_coalesced_async()");
  auto& g = member("ProcessGroup.all_reduce_coalesced");
  const CollKind k = CollKind::all_reduce_coalesced;
  if (tensors.empty()) return blocking ? Future<void>() : make_ready_future();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::string what = "tensors[" + std::to_string(i) + "]";
    check_tensor(tensors[i], k, what.c_str());
    if (tensors[i].dtype() != tensors[0].dtype())
      throw DTypeError(op_label(k), what + " has dtype " + std::string(dtype_name(tensors[i].dtype())) +
                                        ", tensors[0] has " + std::string(dtype_name(tensors[0].dtype())));
  }
  check_reducible(tensors[0], options.op, k);
  if (options.pre_divisor < 0)
    throw ValueError(op_label(k), "pre_divisor must be >= 0, got " + std::to_string(options.pre_divisor));
  if (options.pre_divisor > 0 && (options.op != ReduceOp::sum || !is_floating_point(tensors[0].dtype())))
    throw ValueError(op_label(k), "pre_divisor needs ReduceOp sum of floating-point tensors");
  std::int64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  detail::CollDesc d;
  d.kind = k;
  d.op = options.op;
  d.dtype = tensors[0].dtype();
  d.shape = {total};
  d.extra = shapes_str(tensors);
  d.order = options.order;
  d.pre_divisor = options.pre_divisor;
  if (tensors[0].device().is_cpu() && (!g.plane || !g.plane->supports(d)))  // flatten, reduce, copy back
    return detail::emulate_all_reduce_coalesced(*this, tensors, options, blocking);
  return submit(*this, g, make_op(g, std::move(d), tensors), blocking);
}

Future<void> ProcessGroup::broadcast_coalesced_impl(const std::vector<Tensor>& tensors, int src, bool blocking) {
  detail::CallScope scope(blocking ? "ProcessGroup::broadcast_coalesced()"
                                   : "ProcessGroup::broadcast_coalesced_async()");
  auto& g = member("ProcessGroup.broadcast_coalesced");
  const CollKind k = CollKind::broadcast_coalesced;
  check_rank(src, size(), k, "src");
  if (tensors.empty()) return blocking ? Future<void>() : make_ready_future();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::string what = "tensors[" + std::to_string(i) + "]";
    check_tensor(tensors[i], k, what.c_str());
    total += static_cast<std::int64_t>(tensors[i].nbytes());
  }
  detail::CollDesc d;
  d.kind = k;
  d.dtype = DType::uint8;
  d.shape = {total};
  d.root = src;
  d.extra = shapes_str(tensors);
  for (const auto& t : tensors) d.extra += " " + std::string(dtype_name(t.dtype()));
  if (tensors[0].device().is_cpu() && (!g.plane || !g.plane->supports(d)))
    return detail::emulate_broadcast_coalesced(*this, tensors, src, blocking);
  return submit(*this, g, make_op(g, std::move(d), tensors), blocking);
}

Future<void> detail::all_reduce_with(ProcessGroup& pg, const Tensor& t, const AllReduceCoalescedOptions& options,
                                     bool blocking) {
  auto& g = *detail::Access::impl(pg);
  detail::CollDesc d = desc_of(CollKind::all_reduce, t, -1, options.op);
  d.order = options.order;
  d.pre_divisor = options.pre_divisor;
  return submit(pg, g, make_op(g, std::move(d), {t}), blocking);
}

Future<void> ProcessGroup::broadcast_async(const Tensor& t, int src) { return broadcast_impl(t, src, false); }
void ProcessGroup::broadcast(const Tensor& t, int src) { wait_blocking(broadcast_impl(t, src, true)); }
Future<void> ProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) { return all_reduce_impl(t, op, false); }
void ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) { wait_blocking(all_reduce_impl(t, op, true)); }
Future<void> ProcessGroup::reduce_async(const Tensor& t, int dst, ReduceOp op) { return reduce_impl(t, dst, op, false); }
void ProcessGroup::reduce(const Tensor& t, int dst, ReduceOp op) { wait_blocking(reduce_impl(t, dst, op, true)); }
Future<void> ProcessGroup::all_gather_async(const std::vector<Tensor>& outputs, const Tensor& input) {
  return all_gather_impl(outputs, input, false);
}
void ProcessGroup::all_gather(const std::vector<Tensor>& outputs, const Tensor& input) {
  wait_blocking(all_gather_impl(outputs, input, true));
}
Future<void> ProcessGroup::all_gather_into_tensor_async(const Tensor& output, const Tensor& input) {
  return all_gather_into_tensor_impl(output, input, false);
}
void ProcessGroup::all_gather_into_tensor(const Tensor& output, const Tensor& input) {
  wait_blocking(all_gather_into_tensor_impl(output, input, true));
}
Future<void> ProcessGroup::reduce_scatter_async(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  return reduce_scatter_impl(output, inputs, op, false);
}
void ProcessGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  wait_blocking(reduce_scatter_impl(output, inputs, op, true));
}
Future<void> ProcessGroup::barrier_async() { return barrier_impl(false); }
void ProcessGroup::barrier() { wait_blocking(barrier_impl(true)); }
Future<void> ProcessGroup::all_reduce_coalesced_async(const std::vector<Tensor>& tensors,
                                                      const AllReduceCoalescedOptions& options) {
  return all_reduce_coalesced_impl(tensors, options, false);
}
void ProcessGroup::all_reduce_coalesced(const std::vector<Tensor>& tensors, const AllReduceCoalescedOptions& options) {
  wait_blocking(all_reduce_coalesced_impl(tensors, options, true));
}
Future<void> ProcessGroup::broadcast_coalesced_async(const std::vector<Tensor>& tensors, int src) {
  return broadcast_coalesced_impl(tensors, src, false);
}
void ProcessGroup::broadcast_coalesced(const std::vector<Tensor>& tensors, int src) {
  wait_blocking(broadcast_coalesced_impl(tensors, src, true));
}

Future<void> ProcessGroup::send_async(const Tensor& tensor, int dst, int tag) {
  detail::CallScope scope("ProcessGroup::send_async()");
  auto& g = member("ProcessGroup.send");
  auto op = make_p2p_op(g, CollKind::send, tensor, dst, tag);
  if (detail::sim::active()) [[unlikely]]  // deterministic simulation: the fault plan's delays and losses
    return detail::sim::faulty_send(std::move(op), [self = *this, &g](std::shared_ptr<Op> o) {
      return submit(self, g, std::move(o), false);
    });
  return submit(*this, g, std::move(op), false);
}

Future<void> ProcessGroup::recv_async(const Tensor& tensor, int src, int tag) {
  detail::CallScope scope("ProcessGroup::recv_async()");
  auto& g = member("ProcessGroup.recv");
  auto op = make_p2p_op(g, CollKind::recv, tensor, src, tag);
  if (detail::sim::active()) [[unlikely]] {
    const Op& o = *op;
    return detail::sim::faulty_recv(o, submit(*this, g, op, false));
  }
  return submit(*this, g, std::move(op), false);
}

namespace {

std::string ranks_str(const std::vector<int>& r) {
  std::string s = "[";
  for (std::size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s + "]";
}

// Runs the world collective that creates groups; returns its sequence number.
// The groups' ids derive from the call's sequence number, so every rank
// computes the same ones: (seq + 1) << 16, plus k + 1 for subgroup k.
// make_specs(seq) lists the groups (so the plane can set them up in the call).
std::uint64_t group_creation_barrier(const ProcessGroup& pg, GroupImpl& world, const std::string& what,
                                     const std::function<std::vector<detail::GroupSpec>(std::uint64_t)>& make_specs) {
  detail::CollDesc d;
  d.kind = CollKind::new_group;
  d.extra = what;
  auto op = make_op(world, d, {});
  std::uint64_t seq = op->seq;
  op->creates = make_specs(seq);
  submit(pg, world, std::move(op), true);
  return seq;
}

std::shared_ptr<GroupImpl> make_group(const GroupImpl& world, std::uint64_t gid, std::vector<int> ranks) {
  auto g = std::make_shared<GroupImpl>();
  g->endpoint = world.endpoint;
  g->gid = gid;
  int me = world.my_grank;  // world group rank == global rank
  auto it = std::find(ranks.begin(), ranks.end(), me);
  g->my_grank = it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
  g->members = std::make_shared<const std::vector<int>>(std::move(ranks));
  g->timeout_ms.store(world.timeout_ms.load());
  g->local_world_size = world.local_world_size;
  g->peers = world.peers;
  if (g->my_grank >= 0 && world.plane) g->plane = world.plane->made_group(gid);
  return g;
}

}  // namespace

ProcessGroup ProcessGroup::new_group(std::vector<int> ranks) {
  detail::CallScope scope("ProcessGroup::new_group()");
  auto& w = member("ProcessGroup.new_group");
  if (!w.is_world) throw StateError("ProcessGroup.new_group", "call new_group on the world group");
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty()) throw ValueError("ProcessGroup.new_group", "ranks is empty");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size())
      throw ValueError("ProcessGroup.new_group", "rank " + std::to_string(ranks[i]) +
                                                     " is out of range for a world of size " +
                                                     std::to_string(size()));
    if (i && ranks[i] == ranks[i - 1])
      throw ValueError("ProcessGroup.new_group", "rank " + std::to_string(ranks[i]) + " is listed twice");
  }
  std::uint64_t seq = group_creation_barrier(*this, w, "ranks " + ranks_str(ranks), [&](std::uint64_t s) {
    return std::vector<detail::GroupSpec>{{(s + 1) << 16, ranks}};
  });
  return detail::Access::group(make_group(w, (seq + 1) << 16, std::move(ranks)));
}

Subgroups ProcessGroup::new_subgroups(int group_size) {
  detail::CallScope scope("ProcessGroup::new_subgroups()");
  auto& w = member("ProcessGroup.new_subgroups");
  if (!w.is_world) throw StateError("ProcessGroup.new_subgroups", "call new_subgroups on the world group");
  if (group_size == 0)  // one group per node (simulated ranks are all on one node)
    group_size = w.local_world_size > 0 ? w.local_world_size : size();
  if (group_size < 0 || group_size > size())
    throw ValueError("ProcessGroup.new_subgroups", "group_size " + std::to_string(group_size) +
                                                       " must be in [1, " + std::to_string(size()) + "]");
  if (size() % group_size != 0)
    throw ValueError("ProcessGroup.new_subgroups", "the world size " + std::to_string(size()) +
                                                       " must be divisible by group_size " +
                                                       std::to_string(group_size));
  auto members_of = [&](int k) {
    std::vector<int> ranks;
    for (int r = k * group_size; r < (k + 1) * group_size; ++r) ranks.push_back(r);
    return ranks;
  };
  std::uint64_t seq = group_creation_barrier(*this, w, "group_size " + std::to_string(group_size), [&](std::uint64_t s) {
    std::vector<detail::GroupSpec> specs;
    for (int k = 0; k * group_size < size(); ++k)
      specs.push_back({((s + 1) << 16) | static_cast<std::uint64_t>(k + 1), members_of(k)});
    return specs;
  });
  Subgroups out;
  for (int k = 0; k * group_size < size(); ++k) {
    std::vector<int> ranks;
    for (int r = k * group_size; r < (k + 1) * group_size; ++r) ranks.push_back(r);
    auto g = make_group(w, ((seq + 1) << 16) | static_cast<std::uint64_t>(k + 1), std::move(ranks));
    ProcessGroup pg(g);
    if (g->my_grank >= 0) out.current = pg;
    out.all.push_back(pg);
  }
  return out;
}

}  // namespace dopt
