#include "dopt/gpu/nccl.hpp"

#include <nccl.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "cuda_util.hpp"
#include "dopt/actors/internal/device_plane.hpp"
#include "dopt/gpu/device.hpp"
#include "dopt/runtime/launch_env.hpp"
#include "nccl_errors.hpp"

namespace dopt::gpu {
namespace detail {

void register_nccl_group(const ProcessGroup& group, int device, std::shared_ptr<NcclProcessGroup> g);

static_assert(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 && ncclInternalError == 3 &&
                  ncclInvalidArgument == 4 && ncclInvalidUsage == 5 && ncclRemoteError == 6 && ncclInProgress == 7,
              "nccl_errors.hpp assumes these ncclResult_t values");

const char* nccl_result_name(int code) noexcept {
  switch (code) {
    case 0: return "ncclSuccess";
    case 1: return "ncclUnhandledCudaError";
    case 2: return "ncclSystemError";
    case 3: return "ncclInternalError";
    case 4: return "ncclInvalidArgument";
    case 5: return "ncclInvalidUsage";
    case 6: return "ncclRemoteError";
    case 7: return "ncclInProgress";
  }
  return "unknown ncclResult_t";
}

std::exception_ptr nccl_error(int code, const std::string& op, int rank, const std::string& detail) {
  if (code == 0 || code == 7) return nullptr;
  std::string what = std::string("NCCL ") + nccl_result_name(code) + " (" + std::to_string(code) + ")";
  if (!detail.empty()) what += ": " + detail;
  switch (code) {
    case 1: return std::make_exception_ptr(DeviceError(op, what, rank));
    case 2: return std::make_exception_ptr(IOError(op, what, rank));
    case 4: return std::make_exception_ptr(ValueError(op, what, rank));
    case 5: return std::make_exception_ptr(StateError(op, what, rank));
    case 6: return std::make_exception_ptr(PeerLostError(op, what, rank));
    default: return std::make_exception_ptr(Error(op, what, rank));
  }
}

std::exception_ptr nccl_failure(int code, const std::string& op, int rank, const std::string& detail) {
  if (auto e = nccl_error(code, op, rank, detail)) return e;
  std::string what = std::string("the NCCL communicator's state could not be determined (last result ") +
                     nccl_result_name(code) + ")";
  if (!detail.empty()) what += ": " + detail;
  return std::make_exception_ptr(Error(op, what, rank));
}

int default_nccl_device(std::optional<int> local_rank, int current_device, int device_count) {
  if (!local_rank) return current_device;
  if (*local_rank < 0 || *local_rank >= device_count)
    throw ValueError("make_nccl_group", "the launcher's local rank is " + std::to_string(*local_rank) + " but " +
                                            std::to_string(device_count) +
                                            " CUDA device(s) are visible: start one process per GPU, or pass the "
                                            "device explicitly");
  return *local_rank;
}

}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;
using detail::check;

ncclDataType_t nccl_dtype(DType d) {
  switch (d) {
    case DType::float32: return ncclFloat32;
    case DType::float64: return ncclFloat64;
    case DType::float16: return ncclFloat16;
    case DType::bfloat16: return ncclBfloat16;
    case DType::int32: return ncclInt32;
    case DType::int64: return ncclInt64;
    case DType::int8: return ncclInt8;
    case DType::uint8: return ncclUint8;
    case DType::bool_: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::product: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

std::string label(const char* op) { return std::string("NcclProcessGroup.") + op; }

std::string last_error(ncclComm_t comm) {
  const char* s = ncclGetLastError(comm);
  return s ? std::string(s) : std::string();
}

}  // namespace

struct NcclProcessGroup::Impl {
  ProcessGroup cpu;
  int rank = 0, size = 0, device = 0, grank = 0;
  // This communicator's own stream (torch: one NCCL stream per group and
  // device), so that collectives of two groups issued from two threads never
  // queue behind each other on one stream, which could deadlock across GPUs.
  std::unique_ptr<Stream> own_stream;
  Stream* stream = nullptr;
  ncclComm_t comm = nullptr;
  std::mutex mutex;  // guards comm calls and abort
  std::atomic<bool> is_aborted{false};
  std::string abort_reason;

  std::chrono::milliseconds timeout() const { return cpu.timeout(); }

  // Aborts with mutex held.
  void abort_locked(const std::string& why) {
    if (is_aborted.exchange(true)) return;
    abort_reason = why;
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> g(mutex);
    abort_locked(why);
  }

  std::exception_ptr aborted_error(const std::string& op) const {
    return std::make_exception_ptr(
        StateError(op, "the NCCL communicator was aborted earlier (" + abort_reason + ")", grank));
  }

  // Polls a nonblocking communicator until its last call is no longer in
  // progress; with mutex held. Aborts and throws on error or timeout.
  void wait_ready_locked(ncclResult_t r, const std::string& op, Clock::time_point deadline) {
    ncclComm_t c = comm;
    const detail::NcclWaitResult w = detail::wait_nccl(
        static_cast<int>(r),
        [c](int& out) {
          ncclResult_t a = ncclSuccess;
          const ncclResult_t q = ncclCommGetAsyncError(c, &a);
          out = static_cast<int>(a);
          return static_cast<int>(q);
        },
        deadline);
    if (w.timed_out) {
      abort_locked(op + " timed out after " + std::to_string(timeout().count()) + " ms");
      throw TimeoutError(op, "the NCCL call did not finish within the group's timeout (" +
                                 std::to_string(timeout().count()) + " ms); the communicator was aborted",
                         grank);
    }
    if (w.code != 0) {
      std::string detail = c ? last_error(c) : std::string();
      if (w.query_failed) detail = "ncclCommGetAsyncError failed" + (detail.empty() ? "" : ": " + detail);
      abort_locked(op + " failed: " + detail::nccl_result_name(w.code));
      std::rethrow_exception(detail::nccl_failure(w.code, op, grank, detail));
    }
  }

  // Enqueues `issue` (NCCL calls on comm/stream), then `after` (e.g. copies),
  // and returns a future filled when the stream has passed them. On this
  // communicator's stream: [start event] [wait for the caller's current
  // stream] [issue] [after] [end event]. The group's timeout counts from the
  // start event, i.e. once this group's earlier collectives are done, so it
  // covers waiting for the inputs' producers and for the peers, not the time
  // queued behind earlier work.
  template <class Issue, class After>
  Future<void> run(const char* opname, std::vector<Tensor> keep, Issue issue, After after,
                   const std::shared_ptr<Impl>& self) {
    const std::string op = label(opname);
    std::lock_guard<std::mutex> g(mutex);
    if (is_aborted) return make_failed_future(aborted_error(op));
    const auto enqueue_deadline = Clock::now() + timeout();
    detail::DeviceGuard dg(device);
    cudaStream_t s = detail::native(*stream);
    Event start;
    try {
      start = stream->record();
      // The inputs are ready on the caller's stream: the collective starts after
      // everything the calling thread enqueued there so far (on the device; the
      // host does not wait).
      Stream& caller = current_stream(device);
      if (&caller != stream) stream->wait(caller.record());
      wait_ready_locked(issue(comm, s), op, enqueue_deadline);
      after(s);
    } catch (...) {
      return make_failed_future(std::current_exception());
    }
    detail::Watch w;
    w.op = op;
    w.event = stream->record();
    w.start = std::move(start);
    w.timeout = timeout();
    w.keep = detail::storages_of(keep);
    std::weak_ptr<Impl> weak = self;
    w.poll_error = [weak, op]() -> std::exception_ptr {
      auto me = weak.lock();
      if (!me) return nullptr;
      std::unique_lock<std::mutex> lock(me->mutex, std::try_to_lock);
      if (!lock.owns_lock()) return nullptr;  // an issuing thread holds it; ask next round
      if (me->is_aborted) return me->aborted_error(op);
      ncclResult_t r = ncclSuccess;
      if (ncclCommGetAsyncError(me->comm, &r) != ncclSuccess || r == ncclSuccess || r == ncclInProgress)
        return nullptr;
      const std::string detail = last_error(me->comm);
      me->abort_locked(op + " failed: " + detail::nccl_result_name(r));
      return detail::nccl_error(r, op, me->grank, detail);
    };
    w.on_timeout = [weak, op]() -> std::exception_ptr {
      auto me = weak.lock();
      const long long ms = me ? me->timeout().count() : 0;
      if (me) me->abort(op + " timed out after " + std::to_string(ms) + " ms");
      return std::make_exception_ptr(TimeoutError(
          op,
          "the collective did not finish within the group's timeout (" + std::to_string(ms) +
              " ms): a member did not make the matching call, or failed; the communicator was aborted",
          me ? me->grank : -1));
    };
    Future<void> f = w.promise.get_future();
    detail::watch(std::move(w));
    return f;
  }

  // --- argument checks (the CPU ProcessGroup's) ---------------------------------------

  void check_tensor(const Tensor& t, const char* opname, const std::string& what) const {
    const std::string op = label(opname);
    if (!t.defined()) throw ValueError(op, what + " is undefined", grank);
    if (!t.device().is_cuda() || t.device().index != device)
      throw DeviceError(op, what + " is on " + t.device().str() + "; this communicator is on cuda:" +
                                std::to_string(device), grank);
  }
  void check_reducible(const Tensor& t, ReduceOp rop, const char* opname) const {
    if (t.dtype() == DType::bool_) throw DTypeError(label(opname), "reductions do not support bool tensors", grank);
    if (rop == ReduceOp::avg && !is_floating_point(t.dtype()))
      throw DTypeError(label(opname), "ReduceOp avg needs a floating point tensor, got " +
                                          std::string(dtype_name(t.dtype())), grank);
  }
  void check_same(const Tensor& ref, const Tensor& t, const char* opname, const std::string& what) const {
    if (t.dtype() != ref.dtype())
      throw DTypeError(label(opname), what + " has dtype " + std::string(dtype_name(t.dtype())) + ", expected " +
                                          std::string(dtype_name(ref.dtype())), grank);
    if (t.shape() != ref.shape())
      throw ShapeError(label(opname),
                       what + " has shape " + shape_str(t.shape()) + ", expected " + shape_str(ref.shape()), grank);
  }
  /// A call with one tensor per group rank: checks them (`name` + "s[i]",
  /// each like `mine`) and stages the call: `flat`, one buffer the size of all
  /// of them, and `keep`, what the call holds on to (per_rank, mine, flat).
  struct PerRank {
    Tensor flat;
    std::vector<Tensor> keep;
  };
  PerRank stage_per_rank(const Tensor& mine, const std::vector<Tensor>& per_rank, const char* opname,
                         const std::string& name) const {
    if (static_cast<int>(per_rank.size()) != size)
      throw ValueError(label(opname), "got " + std::to_string(per_rank.size()) + " " + name +
                                          " tensors for a group of size " + std::to_string(size), grank);
    for (std::size_t i = 0; i < per_rank.size(); ++i) {
      const std::string what = name + "s[" + std::to_string(i) + "]";
      check_tensor(per_rank[i], opname, what);
      check_same(mine, per_rank[i], opname, what);
    }
    Tensor flat = Tensor::empty({mine.numel() * size}, mine.dtype(), mine.device());
    std::vector<Tensor> keep = per_rank;
    keep.push_back(mine);
    keep.push_back(flat);
    return {flat, std::move(keep)};
  }
  void check_rank(int r, const char* opname, const char* what) const {
    if (r < 0 || r >= size)
      throw ValueError(label(opname), std::string(what) + " " + std::to_string(r) +
                                          " is out of range for a group of size " + std::to_string(size), grank);
  }
  /// A send (send == true) or recv of t with group rank `peer` (checked: in
  /// range, not this rank), through run().
  Future<void> p2p(const Tensor& t, int peer, bool send, const std::shared_ptr<Impl>& self) {
    const char* opname = send ? "send" : "recv";
    check_tensor(t, opname, "tensor");
    check_rank(peer, opname, send ? "dst" : "src");
    if (peer == rank)
      throw ValueError(label(opname), send ? "a rank cannot send to itself" : "a rank cannot receive from itself",
                       grank);
    return run(opname, {t}, [&](ncclComm_t c, cudaStream_t s) {
      const auto n = static_cast<size_t>(t.numel());
      return send ? ncclSend(t.data_ptr(), n, nccl_dtype(t.dtype()), peer, c, s)
                  : ncclRecv(t.data_ptr(), n, nccl_dtype(t.dtype()), peer, c, s);
    }, [](cudaStream_t) {}, self);
  }

};

namespace {

void check_nccl(ncclResult_t r, const std::string& op, int rank) {
  if (r != ncclSuccess && r != ncclInProgress) std::rethrow_exception(detail::nccl_error(r, op, rank));
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

int resolve_device(int device) {
  if (device >= 0) return device;
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  std::optional<int> local;
  if (auto env = launch_env_from_environment()) local = env->local_rank;
  return detail::default_nccl_device(local, d, device_count());
}

std::shared_ptr<NcclProcessGroup::Impl> new_impl(const ProcessGroup& cpu, int device) {
  auto impl = std::make_shared<NcclProcessGroup::Impl>();
  impl->cpu = cpu;
  impl->rank = cpu.rank();
  impl->size = cpu.size();
  impl->device = device;
  impl->grank = cpu.global_rank(cpu.rank());
  impl->own_stream = make_stream(device);
  impl->stream = impl->own_stream.get();
  return impl;
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

NcclProcessGroup::~NcclProcessGroup() {
  if (!impl_) return;
  std::lock_guard<std::mutex> g(impl_->mutex);
  if (impl_->is_aborted || !impl_->comm) return;
  // Finalize (bounded), then destroy; abort when it does not finish.
  detail::DeviceGuard dg(impl_->device);
  ncclResult_t r = ncclCommFinalize(impl_->comm);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (r == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::yield();
    if (ncclCommGetAsyncError(impl_->comm, &r) != ncclSuccess) break;
  }
  if (r == ncclSuccess) ncclCommDestroy(impl_->comm);
  else ncclCommAbort(impl_->comm);
  impl_->comm = nullptr;
}

int NcclProcessGroup::rank() const noexcept { return impl_->rank; }
int NcclProcessGroup::size() const noexcept { return impl_->size; }
int NcclProcessGroup::device() const noexcept { return impl_->device; }
const ProcessGroup& NcclProcessGroup::cpu_group() const noexcept { return impl_->cpu; }
Stream& NcclProcessGroup::stream() const noexcept { return *impl_->stream; }
bool NcclProcessGroup::aborted() const { return impl_->is_aborted; }
void NcclProcessGroup::abort(const std::string& why) { impl_->abort(why); }

std::shared_ptr<NcclProcessGroup> make_nccl_group(ProcessGroup cpu_group, int device) {
  const char* op = "make_nccl_group";
  if (!cpu_group.valid() || !cpu_group.is_member())
    throw StateError(op, "this rank is not a member of the group");
  device = resolve_device(device);
  auto impl = new_impl(cpu_group, device);
  // The unique id: made by group rank 0, broadcast over the CPU group. The
  // last byte says whether rank 0 got one: when it did not, every member
  // fails here (instead of the others waiting for an id that never comes).
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  Tensor bytes = Tensor::zeros({static_cast<std::int64_t>(sizeof(id)) + 1}, DType::uint8);
  std::exception_ptr id_error;
  if (impl->rank == 0) {
    try {
      check_nccl(ncclGetUniqueId(&id), op, impl->grank);
      std::memcpy(bytes.data_ptr(), &id, sizeof(id));
      static_cast<unsigned char*>(bytes.data_ptr())[sizeof(id)] = 1;
    } catch (...) {
      id_error = std::current_exception();
    }
  }
  cpu_group.broadcast(bytes, 0);
  if (id_error) std::rethrow_exception(id_error);
  if (static_cast<unsigned char*>(bytes.data_ptr())[sizeof(id)] != 1)
    throw StateError(op, "group rank 0 could not make an NCCL unique id", impl->grank);
  std::memcpy(&id, bytes.data_ptr(), sizeof(id));
  {
    std::lock_guard<std::mutex> g(impl->mutex);
    detail::DeviceGuard dg(device);
    ncclConfig_t config = nonblocking_config();
    ncclResult_t r = ncclCommInitRankConfig(&impl->comm, impl->size, id, impl->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (impl->comm) ncclCommAbort(impl->comm);
      impl->comm = nullptr;
      impl->is_aborted = true;
      std::rethrow_exception(detail::nccl_error(r, op, impl->grank));
    }
    impl->wait_ready_locked(r, op, Clock::now() + impl->timeout());
  }
  return std::make_shared<NcclProcessGroup>(impl);
}

std::shared_ptr<NcclProcessGroup> NcclProcessGroup::split(const ProcessGroup& subgroup) {
  const std::string op = label("split");
  if (!subgroup.valid()) throw ValueError(op, "the subgroup handle is invalid", impl_->grank);
  for (int r : subgroup.ranks())
    if (impl_->cpu.group_rank(r) < 0)
      throw ValueError(op, "global rank " + std::to_string(r) + " of the subgroup is not in this group",
                       impl_->grank);
  const bool member = subgroup.is_member();
  const int color = member ? subgroup.ranks().front() : NCCL_SPLIT_NOCOLOR;
  const int key = member ? subgroup.rank() : 0;
  std::shared_ptr<Impl> child = member ? new_impl(subgroup, impl_->device) : nullptr;
  {
    std::lock_guard<std::mutex> g(impl_->mutex);
    if (impl_->is_aborted) std::rethrow_exception(impl_->aborted_error(op));
    detail::DeviceGuard dg(impl_->device);
    ncclConfig_t config = nonblocking_config();
    ncclComm_t out = nullptr;
    ncclResult_t r = ncclCommSplit(impl_->comm, color, key, &out, &config);
    impl_->wait_ready_locked(r, op, Clock::now() + impl_->timeout());
    if (child) {
      // The new communicator may itself still be initialising.
      child->comm = out;
      std::lock_guard<std::mutex> cg(child->mutex);
      ncclResult_t cr = ncclInProgress;
      if (ncclCommGetAsyncError(out, &cr) != ncclSuccess) cr = ncclInternalError;
      child->wait_ready_locked(cr, op, Clock::now() + child->timeout());
    }
  }
  if (!child) return nullptr;
  auto made = std::make_shared<NcclProcessGroup>(child);
  detail::register_nccl_group(subgroup, impl_->device, made);
  return made;
}

// --- collectives -------------------------------------------------------------------------

namespace {
auto no_after = [](cudaStream_t) {};
}

Future<void> NcclProcessGroup::broadcast_async(const Tensor& tensor, int src) {
  auto& g = *impl_;
  g.check_tensor(tensor, "broadcast", "tensor");
  g.check_rank(src, "broadcast", "src");
  return g.run("broadcast", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                         nccl_dtype(tensor.dtype()), src, c, s);
  }, no_after, impl_);
}

Future<void> NcclProcessGroup::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  auto& g = *impl_;
  g.check_tensor(tensor, "all_reduce", "tensor");
  g.check_reducible(tensor, op, "all_reduce");
  return g.run("all_reduce", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                         nccl_dtype(tensor.dtype()), nccl_op(op), c, s);
  }, no_after, impl_);
}

Future<void> NcclProcessGroup::reduce_async(const Tensor& tensor, int dst, ReduceOp op) {
  auto& g = *impl_;
  g.check_tensor(tensor, "reduce", "tensor");
  g.check_reducible(tensor, op, "reduce");
  g.check_rank(dst, "reduce", "dst");
  return g.run("reduce", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                      nccl_dtype(tensor.dtype()), nccl_op(op), dst, c, s);
  }, no_after, impl_);
}

Future<void> NcclProcessGroup::all_gather_into_tensor_async(const Tensor& output, const Tensor& input) {
  auto& g = *impl_;
  g.check_tensor(input, "all_gather_into_tensor", "input");
  g.check_tensor(output, "all_gather_into_tensor", "output");
  if (output.dtype() != input.dtype())
    throw DTypeError(label("all_gather_into_tensor"), "output has dtype " + std::string(dtype_name(output.dtype())) +
                                                          ", input has " + std::string(dtype_name(input.dtype())),
                     g.grank);
  if (output.numel() != input.numel() * g.size)
    throw ShapeError(label("all_gather_into_tensor"),
                     "output has " + std::to_string(output.numel()) + " elements, expected group size " +
                         std::to_string(g.size) + " x " + std::to_string(input.numel()),
                     g.grank);
  return g.run("all_gather_into_tensor", {input, output}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                         nccl_dtype(input.dtype()), c, s);
  }, no_after, impl_);
}

Future<void> NcclProcessGroup::all_gather_async(const std::vector<Tensor>& outputs, const Tensor& input) {
  auto& g = *impl_;
  g.check_tensor(input, "all_gather", "input");
  auto staged = g.stage_per_rank(input, outputs, "all_gather", "output");
  const Tensor& flat = staged.flat;
  const std::size_t bytes = input.nbytes();
  return g.run("all_gather", std::move(staged.keep), [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllGather(input.data_ptr(), flat.data_ptr(), static_cast<size_t>(input.numel()),
                         nccl_dtype(input.dtype()), c, s);
  }, [&](cudaStream_t s) {
    for (std::size_t k = 0; k < outputs.size(); ++k)
      if (bytes)
        check(cudaMemcpyAsync(outputs[k].data_ptr(), static_cast<char*>(flat.data_ptr()) + k * bytes, bytes,
                              cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync");
  }, impl_);
}

Future<void> NcclProcessGroup::reduce_scatter_async(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  auto& g = *impl_;
  g.check_tensor(output, "reduce_scatter", "output");
  g.check_reducible(output, op, "reduce_scatter");
  auto staged = g.stage_per_rank(output, inputs, "reduce_scatter", "input");
  const Tensor& flat = staged.flat;
  const std::size_t bytes = output.nbytes();
  return g.run("reduce_scatter", std::move(staged.keep), [&](ncclComm_t c, cudaStream_t s) {
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (bytes)
        check(cudaMemcpyAsync(static_cast<char*>(flat.data_ptr()) + k * bytes, inputs[k].data_ptr(), bytes,
                              cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync");
    return ncclReduceScatter(flat.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                             nccl_dtype(output.dtype()), nccl_op(op), c, s);
  }, no_after, impl_);
}

Future<void> NcclProcessGroup::send_async(const Tensor& tensor, int dst) { return impl_->p2p(tensor, dst, true, impl_); }

Future<void> NcclProcessGroup::recv_async(const Tensor& tensor, int src) { return impl_->p2p(tensor, src, false, impl_); }

Future<void> NcclProcessGroup::barrier_async() {
  auto& g = *impl_;
  Tensor one = Tensor::zeros({1}, DType::float32, Device::cuda(g.device));
  return g.run("barrier", {one}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, c, s);
  }, no_after, impl_);
}

int nccl_version() noexcept {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 0;
  return v;
}

// --- the communicators of the implicit path (nccl_plane.cpp) ------------------------------------------------------------------

namespace detail {
namespace {

struct Registry {
  std::mutex mutex;
  // Keyed by the rank's group handle (each simulated rank has its own) and device.
  // Entries hold the group, so a key is never reused while its entry lives.
  std::map<std::pair<const void*, int>, std::shared_ptr<NcclProcessGroup>> groups;
};
Registry& registry() {
  static Registry* r = new Registry();  // communicators live until exit
  return *r;
}

}  // namespace

void register_nccl_group(const ProcessGroup& group, int device, std::shared_ptr<NcclProcessGroup> g) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.groups[{dopt::detail::group_identity(group), device}] = std::move(g);
}

}  // namespace detail

std::shared_ptr<NcclProcessGroup> nccl_group_for(const ProcessGroup& group, int device) {
  auto& r = detail::registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.groups.find({dopt::detail::group_identity(group), device});
    if (it != r.groups.end()) return it->second;
  }
  // Collective over the group (its members all reach this call in the same
  // order, as for any collective); the lock is not held meanwhile.
  auto made = make_nccl_group(group, device);
  detail::register_nccl_group(group, device, made);
  return made;
}

}  // namespace dopt::gpu
