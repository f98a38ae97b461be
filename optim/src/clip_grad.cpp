// Gradient clipping by total norm (clip_grad.hpp): torch 1.13's
// clip_grad_norm_ with its CPU reduction orders.
#include "dopt/optim/clip_grad.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "dopt/optim/internal/clip_grad_sharded.hpp"
#include "dopt/runtime/internal/parallel.hpp"
#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {
namespace kernels {
namespace {

// torch 1.13's float32 L2 reduction (the vectorised last-dimension path):
// eight lanes of fused multiply-adds over whole blocks of eight, the lanes
// added left to right, then the remainder one element at a time, where the
// compiler that built torch multiplied a first block of four apart (product
// rounded, then added) and fused the rest. Returns the sum of squares.
//
// The end of it: the eight lanes of x's first `full` elements (a multiple of
// eight) added, then the remaining elements of x in torch's order.
DOPT_INLINE float finish_sumsq_f32(const float* x, i64 n, i64 full, const float* acc) {
  float b = acc[0];
  for (int j = 1; j < 8; ++j) b = b + acc[j];
  i64 d = full;
  if (n - d >= 4) {
    for (int k = 0; k < 4; ++k) {
      const float sq = x[d + k] * x[d + k];
      b = b + sq;
    }
    d += 4;
  }
  for (; d < n; ++d) b = std::fma(x[d], x[d], b);
  return b;
}

DOPT_KERNEL float sumsq_f32(const float* __restrict x, i64 n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const i64 full = n - n % 8;
  for (i64 d = 0; d < full; d += 8)
    for (int j = 0; j < 8; ++j) acc[j] = std::fma(x[d + j], x[d + j], acc[j]);
  return finish_sumsq_f32(x, n, full, acc);
}

// Two float32 L2 reductions at once, each in torch's order: the two lane
// chains are independent, so the core overlaps their FMA latencies (one
// chain alone is latency-bound at 8 elements per FMA latency). Writes the
// two sums of squares.
DOPT_KERNEL void sumsq2_f32(const float* __restrict x, i64 nx, const float* __restrict y, i64 ny, float* out) {
  float ax[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ay[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const i64 fx = nx - nx % 8, fy = ny - ny % 8, both = fx < fy ? fx : fy;
  i64 d = 0;
  for (; d < both; d += 8)
    for (int j = 0; j < 8; ++j) {
      ax[j] = std::fma(x[d + j], x[d + j], ax[j]);
      ay[j] = std::fma(y[d + j], y[d + j], ay[j]);
    }
  for (i64 e = d; e < fx; e += 8)
    for (int j = 0; j < 8; ++j) ax[j] = std::fma(x[e + j], x[e + j], ax[j]);
  for (i64 e = d; e < fy; e += 8)
    for (int j = 0; j < 8; ++j) ay[j] = std::fma(y[e + j], y[e + j], ay[j]);
  out[0] = finish_sumsq_f32(x, nx, fx, ax);
  out[1] = finish_sumsq_f32(y, ny, fy, ay);
}

// float64 L2 (the generic reduction): one fused multiply-add per element.
DOPT_KERNEL double sumsq_f64(const double* __restrict x, i64 n) {
  double b = 0;
  for (i64 d = 0; d < n; ++d) b = std::fma(x[d], x[d], b);
  return b;
}

// L1: |x| added one element at a time, in the element type.
template <class T>
DOPT_INLINE T sumabs_body(const T* __restrict x, i64 n) {
  T b = 0;
  for (i64 d = 0; d < n; ++d) b = b + std::fabs(x[d]);
  return b;
}
DOPT_KERNEL float sumabs_f32(const float* x, i64 n) { return sumabs_body(x, n); }
DOPT_KERNEL double sumabs_f64(const double* x, i64 n) { return sumabs_body(x, n); }

// max |x| propagating NaN (torch's AbsMaxOps); the order does not matter for
// the value. Eight lanes so that it vectorises.
template <class T>
DOPT_INLINE T absmax_body(const T* __restrict x, i64 n) {
  T m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const i64 full = n - n % 8;
  for (i64 d = 0; d < full; d += 8)
    for (int j = 0; j < 8; ++j) {
      const T a = std::fabs(x[d + j]);
      m[j] = (m[j] > a || m[j] != m[j]) ? m[j] : a;
    }
  T r = 0;
  for (int j = 0; j < 8; ++j) r = (r > m[j] || r != r) ? r : m[j];
  for (i64 d = full; d < n; ++d) {
    const T a = std::fabs(x[d]);
    r = (r > a || r != r) ? r : a;
  }
  return r;
}
DOPT_KERNEL float absmax_f32(const float* x, i64 n) { return absmax_body(x, n); }
DOPT_KERNEL double absmax_f64(const double* x, i64 n) { return absmax_body(x, n); }

template <class T>
DOPT_INLINE void scale_body(T* __restrict x, i64 n, T c) {
  for (i64 d = 0; d < n; ++d) x[d] = x[d] * c;
}
DOPT_KERNEL void scale_f32(float* x, i64 n, float c) { scale_body(x, n, c); }
DOPT_KERNEL void scale_f64(double* x, i64 n, double c) { scale_body(x, n, c); }

inline float sumsq(const float* x, i64 n) { return sumsq_f32(x, n); }
inline double sumsq(const double* x, i64 n) { return sumsq_f64(x, n); }
inline float sumabs(const float* x, i64 n) { return sumabs_f32(x, n); }
inline double sumabs(const double* x, i64 n) { return sumabs_f64(x, n); }
inline float absmax(const float* x, i64 n) { return absmax_f32(x, n); }
inline double absmax(const double* x, i64 n) { return absmax_f64(x, n); }
inline void scale(float* x, i64 n, float c) { scale_f32(x, n, c); }
inline void scale(double* x, i64 n, double c) { scale_f64(x, n, c); }

/// torch.norm(x, p) over a contiguous float32/float64 array, in T.
template <class T>
T norm_of(const T* x, i64 n, double p) {
  if (p == 2.0) return std::sqrt(sumsq(x, n));
  if (p == 1.0) return sumabs(x, n);
  if (std::isinf(p)) return absmax(x, n);
  // torch's generic NormOps: p held as float (the kernel's `float val`).
  const T pp = static_cast<T>(static_cast<float>(p));
  T b = 0;
  for (i64 d = 0; d < n; ++d) b = b + std::pow(std::fabs(x[d]), pp);
  return std::pow(b, T(1) / pp);
}

/// 16-bit gradients: the same orders in float32 (not torch's 16-bit result).
template <class H>
float norm_of_16(const H* x, i64 n, double p) {
  std::vector<float> f(static_cast<std::size_t>(n));
  for (i64 d = 0; d < n; ++d) f[static_cast<std::size_t>(d)] = static_cast<float>(x[d]);
  return norm_of(f.data(), n, p);
}

}  // namespace
}  // namespace kernels

namespace {

using kernels::i64;

void check_grad(const Tensor& g, const std::string& op) {
  if (!g.device().is_cpu())
    throw NotSupportedError(op, "gradients on " + g.device().str() + " are not supported (CPU only)");
  switch (g.dtype()) {
    case DType::float32:
    case DType::float64:
    case DType::float16:
    case DType::bfloat16:
      return;
    default:
      throw DTypeError(op, "gradients must be floating point, got " + std::string(dtype_name(g.dtype())));
  }
}

void check_args(double max_norm, const ClipGradNormOptions& o, const std::string& op) {
  if (!std::isfinite(max_norm)) throw ValueError(op, "max_norm must be finite, got " + detail::py_float(max_norm));
  if (!(o.norm_type > 0.0))
    throw ValueError(op, "norm_type must be > 0 (or infinity), got " + detail::py_float(o.norm_type));
  if (o.num_threads < 1) throw ValueError(op, "num_threads must be >= 1, got " + std::to_string(o.num_threads));
}

double norm_value(const Tensor& g, double p) {
  const i64 n = g.numel();
  switch (g.dtype()) {
    case DType::float32: return kernels::norm_of(g.data<float>(), n, p);
    case DType::float64: return kernels::norm_of(g.data<double>(), n, p);
    case DType::float16: return kernels::norm_of_16(g.data<Half>(), n, p);
    case DType::bfloat16: return kernels::norm_of_16(g.data<BFloat16>(), n, p);
    default: return 0.0;  // checked before
  }
}

/// The per-gradient norms of grads (all defined, checked), by position.
/// float32 L2 norms are taken two gradients at a time (sumsq2_f32).
std::vector<double> norms_of(const std::vector<Tensor>& grads, double p, int threads) {
  std::vector<double> out(grads.size());
  std::vector<std::pair<std::size_t, std::size_t>> items;  // (i, j): j == SIZE_MAX for one alone
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t pending = kNone;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (p != 2.0 || grads[i].dtype() != DType::float32) {
      items.emplace_back(i, kNone);
    } else if (pending == kNone) {
      pending = i;
    } else {
      items.emplace_back(pending, i);
      pending = kNone;
    }
  }
  if (pending != kNone) items.emplace_back(pending, kNone);
  parallel_for(static_cast<std::int64_t>(items.size()), threads, [&](std::int64_t k) {
    const auto [i, j] = items[static_cast<std::size_t>(k)];
    if (j == kNone) {
      out[i] = norm_value(grads[i], p);
      return;
    }
    float sums[2];
    kernels::sumsq2_f32(grads[i].data<float>(), grads[i].numel(), grads[j].data<float>(), grads[j].numel(), sums);
    out[i] = static_cast<double>(std::sqrt(sums[0]));
    out[j] = static_cast<double>(std::sqrt(sums[1]));
  });
  return out;
}

/// torch.norm(torch.stack(norms), p) (torch.max for infinity) in the result
/// dtype: float64 when any gradient is float64, else float32.
double total_of(const std::vector<double>& norms, double p, bool f64) {
  const auto n = static_cast<i64>(norms.size());
  if (f64) return kernels::norm_of(norms.data(), n, p);
  std::vector<float> f(norms.begin(), norms.end());  // exact: each is a float32 value
  return static_cast<double>(kernels::norm_of(f.data(), n, p));
}

/// min(max_norm / (total + 1e-6), 1) as torch evaluates it:
/// reciprocal(total + 1e-6) * max_norm, then clamp (NaN stays NaN).
double coefficient(double total, double max_norm, bool f64) {
  double c;
  if (f64) {
    c = (1.0 / (total + 1e-6)) * max_norm;
  } else {
    const float t = static_cast<float>(total) + static_cast<float>(1e-6);
    c = static_cast<double>((1.0f / t) * static_cast<float>(max_norm));
  }
  return (c != c || c <= 1.0) ? c : 1.0;
}

/// Multiplies every gradient by c (cast to its dtype; 16-bit via float32),
/// in chunks spread over threads. A coefficient of exactly 1 changes nothing.
void scale_all(const std::vector<Tensor>& grads, double c, int threads) {
  if (c == 1.0) return;
  constexpr i64 kChunk = 1 << 16;
  struct Piece {
    std::size_t g;
    i64 off, n;
  };
  // Last gradient first, from its end: the norm pass read them in order, so
  // the last ones read are the ones most likely still in the cache.
  std::vector<Piece> pieces;
  for (std::size_t k = grads.size(); k-- > 0;) {
    const i64 n = grads[k].numel();
    for (i64 off = (n - 1) / kChunk * kChunk; off >= 0 && n > 0; off -= kChunk)
      pieces.push_back({k, off, std::min(kChunk, n - off)});
  }
  parallel_for(static_cast<std::int64_t>(pieces.size()), threads, [&](std::int64_t i) {
    const Piece& pc = pieces[static_cast<std::size_t>(i)];
    const Tensor& g = grads[pc.g];
    switch (g.dtype()) {
      case DType::float32: kernels::scale(g.data<float>() + pc.off, pc.n, static_cast<float>(c)); break;
      case DType::float64: kernels::scale(g.data<double>() + pc.off, pc.n, c); break;
      case DType::float16: {
        Half* x = g.data<Half>() + pc.off;
        for (i64 d = 0; d < pc.n; ++d) x[d] = Half(static_cast<float>(x[d]) * static_cast<float>(c));
        break;
      }
      case DType::bfloat16: {
        BFloat16* x = g.data<BFloat16>() + pc.off;
        for (i64 d = 0; d < pc.n; ++d) x[d] = BFloat16(static_cast<float>(x[d]) * static_cast<float>(c));
        break;
      }
      default: break;
    }
  });
}

[[noreturn]] void nonfinite(double p, const std::string& op, std::optional<int> rank = std::nullopt) {
  throw ValueError(op,
                   "The total norm of order " + detail::py_float(p) +
                       " for gradients is non-finite, so it cannot be clipped (no gradient was changed). To scale "
                       "the gradients by the non-finite norm anyway, set error_if_nonfinite = false",
                   rank);
}

double clip_defined(const std::vector<Tensor>& grads, double max_norm, const ClipGradNormOptions& o,
                    const std::string& op) {
  check_args(max_norm, o, op);
  for (const auto& g : grads) check_grad(g, op);
  if (grads.empty()) return 0.0;
  bool f64 = false;
  for (const auto& g : grads) f64 = f64 || g.dtype() == DType::float64;
  const double total = total_of(norms_of(grads, o.norm_type, o.num_threads), o.norm_type, f64);
  if (o.error_if_nonfinite && !std::isfinite(total)) nonfinite(o.norm_type, op);
  scale_all(grads, coefficient(total, max_norm, f64), o.num_threads);
  return total;
}

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (g.defined()) grads.push_back(std::move(g));
  }
  return grads;
}

}  // namespace

double grad_norm(const Tensor& g, double norm_type) {
  const std::string op = "grad_norm";
  if (!g.defined()) throw ValueError(op, "the tensor is undefined");
  check_grad(g, op);
  if (!(norm_type > 0.0)) throw ValueError(op, "norm_type must be > 0 (or infinity), got " + detail::py_float(norm_type));
  return norm_value(g, norm_type);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, const ClipGradNormOptions& options) {
  return clip_defined(grads_of(params), max_norm, options, "clip_grad_norm");
}

double clip_grad_norm(const std::vector<OptimizerParamGroup>& groups, double max_norm,
                      const ClipGradNormOptions& options) {
  std::vector<Tensor> params;
  for (const auto& g : groups) params.insert(params.end(), g.params.begin(), g.params.end());
  return clip_defined(grads_of(params), max_norm, options, "clip_grad_norm");
}

double clip_gradients(const std::vector<Tensor>& grads, double max_norm, const ClipGradNormOptions& options) {
  std::vector<Tensor> defined;
  for (const auto& g : grads)
    if (g.defined()) defined.push_back(g);
  return clip_defined(defined, max_norm, options, "clip_gradients");
}

namespace detail {

double clip_grad_norm_sharded(const std::vector<Tensor>& all, const std::vector<int>& owners, int rank,
                              ProcessGroup group, double max_norm, const ClipGradNormOptions& options,
                              const std::string& op) {
  try {
    check_args(max_norm, options, op);
  } catch (const ValueError& e) {
    throw ValueError(op, e.detail(), rank);
  }
  const auto n = all.size();
  // The gradients this rank owns, by global index.
  std::vector<std::size_t> mine;
  std::vector<Tensor> grads;
  for (std::size_t i = 0; i < n; ++i) {
    if (owners[i] != rank) continue;
    Tensor g = all[i].grad();
    if (!g.defined()) continue;
    check_grad(g, op);
    mine.push_back(i);
    grads.push_back(std::move(g));
  }
  const std::vector<double> my_norms = norms_of(grads, options.norm_type, options.num_threads);
  // One all-reduce: [norm of each parameter | 1 if its owner has a gradient
  // | 1 if it is float64]; every slot is non-zero on one rank at most, so
  // the sum is exact (x + 0 == x) and every rank gets every owner's values.
  Tensor buf = Tensor::zeros({static_cast<std::int64_t>(3 * n)}, DType::float64);
  double* b = buf.data<double>();
  for (std::size_t k = 0; k < mine.size(); ++k) {
    b[mine[k]] = my_norms[k];
    b[n + mine[k]] = 1.0;
    b[2 * n + mine[k]] = grads[k].dtype() == DType::float64 ? 1.0 : 0.0;
  }
  group.all_reduce(buf, ReduceOp::sum);
  std::vector<double> norms;
  bool f64 = false;
  for (std::size_t i = 0; i < n; ++i)
    if (b[n + i] != 0.0) {
      norms.push_back(b[i]);
      f64 = f64 || b[2 * n + i] != 0.0;
    }
  if (norms.empty()) return 0.0;
  const double total = total_of(norms, options.norm_type, f64);
  if (options.error_if_nonfinite && !std::isfinite(total)) nonfinite(options.norm_type, op, rank);
  scale_all(grads, coefficient(total, max_norm, f64), options.num_threads);
  return total;
}

}  // namespace detail
}  // namespace dopt::optim
