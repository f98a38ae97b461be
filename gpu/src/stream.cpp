#include "dopt/gpu/stream.hpp"

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda_util.hpp"

namespace dopt::gpu {
namespace detail {

// --- events: pooled per device -------------------------------------------------------

class EventPool {
 public:
  cudaEvent_t take(int device) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      auto& free = free_[device];
      if (!free.empty()) {
        cudaEvent_t e = free.back();
        free.pop_back();
        return e;
      }
    }
    DeviceGuard dg(device);
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void give(int device, cudaEvent_t e) noexcept {
    std::lock_guard<std::mutex> g(mutex_);
    free_[device].push_back(e);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudaEvent_t>> free_;
};

EventPool& event_pool() {
  static EventPool* p = new EventPool();  // lives until exit (events may outlive statics)
  return *p;
}

struct EventImpl {
  int device = 0;
  cudaEvent_t event = nullptr;
  ~EventImpl() {
    if (event) event_pool().give(device, event);
  }
};

struct StreamImpl {
  int device = 0;
  cudaStream_t stream = nullptr;
};

cudaStream_t native(Stream& s) { return static_cast<cudaStream_t>(s.native()); }

// --- the completion thread --------------------------------------------------------------

Probe probe(Watch& w, std::string& why) {
  if (w.probe) return w.probe(why);
  const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(w.event.native()));
  if (q == cudaSuccess) return Probe::done;
  if (q == cudaErrorNotReady) return Probe::pending;
  cudaGetLastError();
  why = std::string(cudaGetErrorName(q)) + ": " + cudaGetErrorString(q);
  return Probe::failed;
}

class Completions {
 public:
  void add(Watch w) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      pending_.push_back(std::move(w));
      if (!started_) {
        started_ = true;
        std::thread([this] { run(); }).detach();
      }
    }
    cv_.notify_one();
  }

 private:
  void run() {
    std::vector<Watch> mine;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (mine.empty()) cv_.wait(lock, [&] { return !pending_.empty(); });
        for (auto& w : pending_) mine.push_back(std::move(w));
        pending_.clear();
      }
      // Poll every watch once; fill (outside the lock) those that are decided.
      const auto now = std::chrono::steady_clock::now();
      std::vector<Watch> keep;
      keep.reserve(mine.size());
      for (auto& w : mine) {
        std::string why;
        const Probe q = probe(w, why);
        if (q == Probe::done) {
          w.promise.set_value();
          continue;
        }
        if (q == Probe::failed) {
          w.promise.set_exception(std::make_exception_ptr(DeviceError(w.op, "the GPU work failed: " + why)));
          continue;
        }
        if (w.poll_error) {
          if (auto e = w.poll_error()) {
            w.promise.set_exception(e);
            continue;
          }
        }
        if (now >= w.deadline) {
          std::exception_ptr e = w.on_timeout ? w.on_timeout() : nullptr;
          if (!e) e = std::make_exception_ptr(TimeoutError(w.op, "the GPU work did not finish in time"));
          w.promise.set_exception(e);
          continue;
        }
        keep.push_back(std::move(w));
      }
      mine.swap(keep);
      // A short sleep between rounds: kernel and collective latencies are
      // tens of microseconds or more; the thread sleeps on the condition
      // variable when nothing is pending.
      if (!mine.empty()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Watch> pending_;
  bool started_ = false;
};

void watch(Watch w) {
  static Completions* c = new Completions();  // the thread may outlive statics
  c->add(std::move(w));
}

void keep_until_done(Stream& stream, std::vector<Tensor> tensors, const char* op) {
  if (tensors.empty()) return;
  Watch w;
  w.event = stream.record();
  w.op = op;
  w.keep = std::move(tensors);
  watch(std::move(w));
}

}  // namespace detail

// --- Event ------------------------------------------------------------------------------

int Event::device() const {
  if (!impl_) throw StateError("Event.device", "the event is invalid (default-constructed)");
  return impl_->device;
}

bool Event::query() const {
  if (!impl_) throw StateError("Event.query", "the event is invalid (default-constructed)");
  const cudaError_t q = cudaEventQuery(impl_->event);
  if (q == cudaSuccess) return true;
  if (q == cudaErrorNotReady) return false;
  detail::check(q, "Event.query");
  return false;
}

void* Event::native() const { return impl_ ? impl_->event : nullptr; }

// --- Stream -----------------------------------------------------------------------------

Stream::Stream(int device) : impl_(std::make_unique<detail::StreamImpl>()) {
  impl_->device = device;
  detail::DeviceGuard dg(device);
  detail::check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

Stream::~Stream() {
  if (impl_ && impl_->stream) cudaStreamDestroy(impl_->stream);  // waits for nothing; work still completes
}

int Stream::device() const noexcept { return impl_->device; }
void* Stream::native() const noexcept { return impl_->stream; }

Event Stream::record() {
  auto e = std::make_shared<detail::EventImpl>();
  e->device = impl_->device;
  e->event = detail::event_pool().take(impl_->device);
  detail::DeviceGuard dg(impl_->device);
  detail::check(cudaEventRecord(e->event, impl_->stream), "cudaEventRecord");
  return Event(std::move(e));
}

void Stream::wait(const Event& event) {
  if (!event.valid()) throw ValueError("Stream.wait", "the event is invalid (default-constructed)");
  detail::DeviceGuard dg(impl_->device);
  detail::check(cudaStreamWaitEvent(impl_->stream, static_cast<cudaEvent_t>(event.native()), 0),
                "cudaStreamWaitEvent");
}

Future<void> Stream::completion(std::chrono::milliseconds timeout) {
  detail::Watch w;
  w.event = record();
  w.op = "Stream.completion";
  if (timeout.count() > 0) w.deadline = std::chrono::steady_clock::now() + timeout;
  Future<void> f = w.promise.get_future();
  detail::watch(std::move(w));
  return f;
}

void Stream::synchronize() { detail::check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize"); }

void Stream::copy_async(const Tensor& dst, const Tensor& src) {
  const char* op = "Stream.copy_async";
  check_defined(dst, op, "destination");
  check_defined(src, op, "source");
  check_same_dtype(dst, src, op);
  if (dst.numel() != src.numel())
    throw ShapeError(op, "cannot copy " + std::to_string(src.numel()) + " elements into " +
                             std::to_string(dst.numel()));
  for (const Tensor* t : {&dst, &src})
    if (t->device().is_cuda() && t->device().index != impl_->device)
      throw DeviceError(op, "tensor on " + t->device().str() + " used on a stream of cuda:" +
                                std::to_string(impl_->device));
  if (dst.nbytes() == 0) return;
  detail::DeviceGuard dg(impl_->device);
  detail::check(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDefault, impl_->stream),
                "cudaMemcpyAsync");
  detail::keep_until_done(*this, {dst, src}, op);
}

void Stream::zero_async(const Tensor& tensor) {
  check_defined(tensor, "Stream.zero_async");
  if (!tensor.device().is_cuda() || tensor.device().index != impl_->device)
    throw DeviceError("Stream.zero_async", "tensor on " + tensor.device().str() + " used on a stream of cuda:" +
                                               std::to_string(impl_->device));
  if (tensor.nbytes() == 0) return;
  detail::DeviceGuard dg(impl_->device);
  detail::check(cudaMemsetAsync(tensor.data_ptr(), 0, tensor.nbytes(), impl_->stream), "cudaMemsetAsync");
  detail::keep_until_done(*this, {tensor}, "Stream.zero_async");
}

// --- stream registries -----------------------------------------------------------------

Stream& rank_stream(int global_rank, int device) {
  static std::mutex* m = new std::mutex();
  static auto* streams = new std::map<std::pair<int, int>, std::unique_ptr<Stream>>();
  std::lock_guard<std::mutex> g(*m);
  auto& s = (*streams)[{global_rank, device}];
  if (!s) s = std::make_unique<Stream>(device);
  return *s;
}

std::unique_ptr<Stream> make_stream(int device) { return std::make_unique<Stream>(device); }

namespace {
thread_local std::map<int, Stream*> t_current;
thread_local std::map<int, std::unique_ptr<Stream>> t_own;
}  // namespace

Stream& current_stream(int device) {
  auto it = t_current.find(device);
  if (it != t_current.end() && it->second) return *it->second;
  auto& own = t_own[device];
  if (!own) own = std::make_unique<Stream>(device);
  return *own;
}

StreamGuard::StreamGuard(Stream& stream) : device_(stream.device()) {
  auto it = t_current.find(device_);
  previous_ = it == t_current.end() ? nullptr : it->second;
  t_current[device_] = &stream;
}

StreamGuard::~StreamGuard() { t_current[device_] = previous_; }

}  // namespace dopt::gpu
