// Helpers of a data-parallel training loop (dopt/distributed/trainer.hpp).
#include "dopt/distributed/trainer.hpp"

#include <atomic>
#include <mutex>
#include <string>

#include "dopt/runtime/dtype.hpp"
#include "dopt/runtime/error.hpp"
#include "dopt/actors/internal/call_label.hpp"

namespace dopt {

namespace {

/// The parameters' gradients in buckets (indices), each of one dtype and
/// device and at most bucket_bytes (a larger gradient alone).
std::vector<std::vector<Tensor>> gradient_buckets(const std::vector<Tensor>& params, ProcessGroup& group,
                                                  const AverageGradientsOptions& options, const char* op) {
  const int rank = group.rank();
  std::vector<std::vector<Tensor>> buckets;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (!p.defined()) throw ValueError(op, "parameter " + std::to_string(i) + " is an undefined tensor", rank);
    const Tensor g = p.grad();
    if (!g.defined())
      throw ValueError(op, "parameter " + std::to_string(i) + " has no gradient (every parameter needs one on every "
                               "rank; set a zero gradient for a parameter this step did not use)", rank);
    if (!is_floating_point(g.dtype()))
      throw ValueError(op, "the gradient of parameter " + std::to_string(i) + " is " +
                               std::string(dtype_name(g.dtype())) + ", not a floating-point tensor", rank);
    const bool fits = !buckets.empty() && bytes + g.nbytes() <= options.bucket_bytes() &&
                      buckets.back().front().dtype() == g.dtype() && buckets.back().front().device() == g.device();
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(g);
    bytes += g.nbytes();
  }
  return buckets;
}

/// FNV-1a over the names (with their lengths): the same on every rank and build.
std::uint64_t names_digest(const std::map<std::string, double>& metrics) {
  std::uint64_t h = 1469598103934665603ull;
  auto eat = [&h](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  for (const auto& [name, v] : metrics) {
    for (int k = 0; k < 8; ++k) eat(static_cast<unsigned char>(name.size() >> (8 * k)));
    for (char c : name) eat(static_cast<unsigned char>(c));
  }
  return h;
}

// CoordinatedStop's process-wide state (signal handlers see only statics).
std::atomic<int> g_stop_signal{0};
struct sigaction g_previous[NSIG];
std::mutex g_stop_mutex;     // guards the counts below
int g_installs[NSIG] = {};   // objects handling each signal
int g_stop_users = 0;        // live CoordinatedStop objects

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (!g_stop_signal.compare_exchange_strong(none, sig) && none == sig) {
    // The same signal again while the first is pending: as before this
    // object existed (a second Ctrl-C ends the process).
    ::sigaction(sig, &g_previous[sig], nullptr);
    ::raise(sig);
  }
}

}  // namespace

Future<void> average_gradients_async(const std::vector<Tensor>& params, ProcessGroup& group,
                                     const AverageGradientsOptions& options) {
  dopt::detail::CallScope call_scope("average_gradients_async()");
  const char* op = "average_gradients";
  std::vector<Future<void>> done;
  AllReduceCoalescedOptions o;
  o.op = ReduceOp::sum;
  o.order = options.order();
  o.pre_divisor = group.size();
  for (const auto& bucket : gradient_buckets(params, group, options, op))
    done.push_back(group.all_reduce_coalesced_async(bucket, o));
  return when_all(done);
}

void average_gradients(const std::vector<Tensor>& params, ProcessGroup& group, const AverageGradientsOptions& options) {
  dopt::detail::CallScope call_scope("average_gradients()");
  average_gradients_async(params, group, options).get();
}

std::map<std::string, double> all_reduce_metrics(ProcessGroup& group, const std::map<std::string, double>& metrics,
                                                 ReduceOp op) {
  dopt::detail::CallScope call_scope("all_reduce_metrics()");
  const char* call = "all_reduce_metrics";
  if (op == ReduceOp::product)
    throw ValueError(call, "takes ReduceOp avg, sum, min or max, not product", group.rank());
  // The names first: every rank learns whether any rank has other ones.
  const std::uint64_t h = names_digest(metrics);
  Tensor check = Tensor::zeros({4}, DType::float64);
  double* c = check.data<double>();
  c[0] = double(h >> 32), c[1] = double(h & 0xffffffffu), c[2] = -c[0], c[3] = -c[1];
  group.all_reduce(check, ReduceOp::max);
  if (c[0] != double(h >> 32) || c[1] != double(h & 0xffffffffu) || c[2] != -double(h >> 32) ||
      c[3] != -double(h & 0xffffffffu)) {
    std::string names;
    for (const auto& [name, v] : metrics) names += (names.empty() ? "" : ", ") + name;
    throw CollectiveMismatchError(call, "the ranks passed different metric names (this rank: " +
                                            (names.empty() ? std::string("none") : names) + ")",
                                  group.rank());
  }
  Tensor values = Tensor::zeros({static_cast<std::int64_t>(metrics.size())}, DType::float64);
  double* v = values.data<double>();
  std::size_t k = 0;
  for (const auto& [name, x] : metrics) v[k++] = x;
  if (!metrics.empty()) group.all_reduce(values, op);
  std::map<std::string, double> out;
  k = 0;
  for (const auto& [name, x] : metrics) out.emplace(name, v[k++]);
  return out;
}

CoordinatedStop::CoordinatedStop(std::vector<int> signals) : signals_(std::move(signals)) {
  for (int sig : signals_)
    if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP)
      throw ValueError("CoordinatedStop", "signal " + std::to_string(sig) + " cannot be handled");
  std::lock_guard<std::mutex> lock(g_stop_mutex);
  // Simulated ranks of one process share the handlers: the first object
  // installs them, the last one puts the previous ones back.
  if (g_stop_users++ == 0) g_stop_signal.store(0);
  for (int sig : signals_) {
    if (g_installs[sig]++ > 0) continue;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, &g_previous[sig]);
  }
}

CoordinatedStop::~CoordinatedStop() {
  std::lock_guard<std::mutex> lock(g_stop_mutex);
  for (int sig : signals_)
    if (--g_installs[sig] == 0) ::sigaction(sig, &g_previous[sig], nullptr);
  --g_stop_users;
}

bool CoordinatedStop::should_stop(ProcessGroup& group) {
  dopt::detail::CallScope call_scope("CoordinatedStop::should_stop()");
  Tensor flag = Tensor::zeros({1}, DType::float32);
  flag.data<float>()[0] = g_stop_signal.load() != 0 ? 1.0f : 0.0f;
  group.all_reduce(flag, ReduceOp::max);
  return flag.data<float>()[0] != 0.0f;
}

void CoordinatedStop::request_stop() noexcept {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, -1);
}

int CoordinatedStop::signal() const noexcept { return g_stop_signal.load(); }

}  // namespace dopt
