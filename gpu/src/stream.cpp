#include "dopt/gpu/stream.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
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

}  // namespace detail

struct Event::Impl {
  int device = 0;
  cudaEvent_t event = nullptr;
  ~Impl() {
    if (event) detail::event_pool().give(device, event);
  }
};

struct Stream::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
};

namespace detail {

cudaStream_t native(Stream& s) { return static_cast<cudaStream_t>(s.native()); }

// --- the completion thread --------------------------------------------------------------

// One decided watch, waiting for the dispatcher to fill its promise.
struct Fire {
  Promise<void> promise;
  std::exception_ptr error;  // null: success
  std::vector<std::shared_ptr<Storage>> keep;
};

class Completions {
 public:
  void add(Watch w) {
    {
      std::lock_guard<std::mutex> g(mutex_);
      pending_.push_back(std::move(w));
      if (!started_) {
        started_ = true;
        {
          std::lock_guard<std::mutex> d(dmutex_);
          start_dispatcher_locked();
        }
        std::thread([this] { run(); }).detach();
      }
    }
    cv_.notify_one();
  }

  int dispatchers_started() const noexcept { return started_dispatchers_.load(); }

 private:
  struct Pending {
    Watch w;
    bool started = false;  // the start event has completed (or there is none)
  };

  // Poller: decides watches, queues their outcomes for the dispatcher.
  void run() {
    std::vector<Pending> mine;
    for (;;) {
      bool queued;
      {
        std::lock_guard<std::mutex> d(dmutex_);
        queued = !fires_.empty();
      }
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (mine.empty()) {
          // Nothing to poll: sleep until a watch comes, but wake now and then
          // while outcomes wait for the dispatcher (it may be blocked).
          if (queued) cv_.wait_for(lock, kStall / 4, [&] { return !pending_.empty(); });
          else cv_.wait(lock, [&] { return !pending_.empty(); });
        }
        for (auto& w : pending_) {
          Pending p{std::move(w), false};
          p.started = !p.w.start.valid() && !p.w.start_probe;
          if (p.started && p.w.timeout.count() > 0) p.w.deadline = std::chrono::steady_clock::now() + p.w.timeout;
          mine.push_back(std::move(p));
        }
        pending_.clear();
      }
      std::vector<Fire> decided;
      std::vector<Pending> left;
      left.reserve(mine.size());
      for (auto& p : mine) {
        if (auto f = decide(p)) decided.push_back(std::move(*f));
        else left.push_back(std::move(p));
      }
      mine.swap(left);
      left.clear();  // the decided watches (moved from), outside any lock
      dispatch(std::move(decided));
      // A short sleep between rounds: kernel and collective latencies are
      // tens of microseconds or more.
      if (!mine.empty()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  static std::unique_ptr<Fire> fire(Watch& w, std::exception_ptr e) {
    auto f = std::make_unique<Fire>();
    f->promise = w.promise;
    f->error = std::move(e);
    f->keep = std::move(w.keep);
    return f;
  }

  // One poll of one watch: its outcome, or null while it is pending.
  static std::unique_ptr<Fire> decide(Pending& p) {
    Watch& w = p.w;
    if (!p.started) {
      std::string why;
      const Probe s = w.start_probe ? w.start_probe(why) : probe(w.start, why);
      if (s == Probe::failed)
        return fire(w, std::make_exception_ptr(DeviceError(w.op, "the GPU work failed: " + why)));
      if (s == Probe::pending) return nullptr;  // queued behind earlier work: no deadline yet
      p.started = true;
      if (w.timeout.count() > 0) w.deadline = std::chrono::steady_clock::now() + w.timeout;
    }
    std::string why;
    const Probe q = w.probe ? w.probe(why) : probe(w.event, why);
    if (q == Probe::done) return fire(w, nullptr);
    if (q == Probe::failed) return fire(w, std::make_exception_ptr(DeviceError(w.op, "the GPU work failed: " + why)));
    if (w.poll_error)
      if (auto e = w.poll_error()) return fire(w, e);
    if (std::chrono::steady_clock::now() >= w.deadline) {
      std::exception_ptr e = w.on_timeout ? w.on_timeout() : nullptr;
      if (!e) e = std::make_exception_ptr(TimeoutError(w.op, "the GPU work did not finish in time"));
      return fire(w, e);
    }
    return nullptr;
  }

  static Probe probe(const Event& e, std::string& why) {
    const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(e.native()));
    if (q == cudaSuccess) return Probe::done;
    if (q == cudaErrorNotReady) return Probe::pending;
    cudaGetLastError();
    why = std::string(cudaGetErrorName(q)) + ": " + cudaGetErrorString(q);
    return Probe::failed;
  }

  // Queues outcomes; retires a dispatcher stuck in one continuation.
  void dispatch(std::vector<Fire> decided) {
    {
      std::lock_guard<std::mutex> d(dmutex_);
      for (auto& f : decided) fires_.push_back(std::move(f));
      if (!fires_.empty() && busy_ && std::chrono::steady_clock::now() - busy_since_ >= kStall &&
          live_dispatchers_ < kMaxDispatchers) {
        ++generation_;  // the busy one ends after its continuation returns
        busy_ = false;
        start_dispatcher_locked();
      }
    }
    dcv_.notify_all();
  }

  void start_dispatcher_locked() {
    ++live_dispatchers_;
    ++started_dispatchers_;
    const std::uint64_t gen = generation_;
    std::thread([this, gen] { dispatcher(gen); }).detach();
  }

  void dispatcher(std::uint64_t gen) {
    std::unique_lock<std::mutex> lock(dmutex_);
    for (;;) {
      dcv_.wait(lock, [&] { return generation_ != gen || !fires_.empty(); });
      if (generation_ != gen) break;
      Fire f = std::move(fires_.front());
      fires_.pop_front();
      busy_ = true;
      busy_since_ = std::chrono::steady_clock::now();
      lock.unlock();
      // Continuations run here, on this thread.
      if (f.error) f.promise.set_exception(f.error);
      else f.promise.set_value();
      f = Fire{};  // the storages go back after the promise is filled
      lock.lock();
      if (generation_ != gen) break;  // retired while blocked: a newer dispatcher has the queue
      busy_ = false;
    }
    --live_dispatchers_;
  }

  // Poller.
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Watch> pending_;
  bool started_ = false;
  // Dispatchers (lock order: mutex_ before dmutex_).
  std::mutex dmutex_;
  std::condition_variable dcv_;
  std::deque<Fire> fires_;
  std::uint64_t generation_ = 0;  // the dispatcher of this generation owns the queue
  bool busy_ = false;
  std::chrono::steady_clock::time_point busy_since_;
  int live_dispatchers_ = 0;
  std::atomic<int> started_dispatchers_{0};
};

Completions& completions() {
  static Completions* c = new Completions();  // the threads may outlive statics
  return *c;
}

void watch(Watch w) { completions().add(std::move(w)); }

int dispatchers_started() noexcept { return completions().dispatchers_started(); }

std::vector<std::shared_ptr<Storage>> storages_of(const std::vector<Tensor>& tensors) {
  std::vector<std::shared_ptr<Storage>> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors)
    if (t.defined() && t.storage()) out.push_back(t.storage());
  return out;
}

void keep_until_done(Stream& stream, std::vector<Tensor> tensors, const char* op) {
  if (tensors.empty()) return;
  Watch w;
  w.event = stream.record();
  w.op = op;
  w.keep = storages_of(tensors);
  watch(std::move(w));
}

void wait_for_event(const Event& event, const char* op) {
  const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(event.native()));
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(op, std::string("the GPU work failed: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
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

Stream::Stream(int device) : impl_(std::make_unique<Impl>()) {
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
  auto e = std::make_shared<Event::Impl>();
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
