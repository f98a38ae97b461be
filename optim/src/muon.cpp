#include "dopt/optim/muon.hpp"

#include <atomic>
#include <bit>
#include <cmath>
#include <vector>

#include "kernel_support.hpp"
#include "newton_schulz.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {

namespace {

std::atomic<std::int64_t> g_orthogonalizations{0};

std::string torch_size(const Shape& s) {
  std::string out = "torch.Size([";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "])";
}

}  // namespace

namespace detail {

float round_to_bfloat16(float x) noexcept {
  if (std::isnan(x)) return x;
  std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  bits &= 0xFFFF0000u;
  return std::bit_cast<float>(bits);
}

NsPrecision parse_ns_precision(const std::string& name, const char* op) {
  if (name == "float64") return NsPrecision::float64;
  if (name == "float32") return NsPrecision::float32;
  if (name == "bfloat16") return NsPrecision::bfloat16;
  throw ValueError(op, "Unsupported ns_dtype: '" + name + "' (expected \"float64\", \"float32\" or \"bfloat16\")");
}

void check_newton_schulz_cpu(const char* op) {
#if defined(DOPT_MUON_AVX2)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!ok)
    throw NotSupportedError(op, "this build's Newton-Schulz iteration is compiled for AVX2 and FMA, which this CPU "
                                "lacks (configure with -DDOPT_MUON_AVX2=OFF for a baseline build)");
#else
  (void)op;
#endif
}

}  // namespace detail

void MuonOptions::validate(const std::string& op) const {
  using detail::py_float;
  OptionsCRTP::validate(op);
  if (adjust_lr_fn_ != "original" && adjust_lr_fn_ != "match_rms_adamw")
    throw ValueError(op, "Adjust learning rate function " + adjust_lr_fn_ + " is not supported");
  if (ns_steps_ < 0 || ns_steps_ > 100)
    throw ValueError(op, "ns_steps must be in 0..100, got " + std::to_string(ns_steps_));
  for (double c : ns_coefficients_)
    if (!std::isfinite(c)) throw ValueError(op, "ns_coefficients must be finite, got " + py_float(c));
  detail::parse_ns_precision(ns_dtype_, op.c_str());
}

void MuonOptions::check_param(const Tensor& param, const std::string& op) const {
  if (param.dim() != 2)
    throw ValueError(op, "Muon only supports 2D parameters whereas we found a parameter with size: " +
                             torch_size(param.shape()) +
                             " (give vectors, scalars and other tensors to another optimizer, e.g. AdamW)");
}

double MuonOptions::step_cost(const Shape& shape) const {
  if (shape.size() != 2) return static_cast<double>(shape_numel(shape));
  const double m = static_cast<double>(std::min(shape[0], shape[1]));
  const double n = static_cast<double>(std::max(shape[0], shape[1]));
  return static_cast<double>(ns_steps_) * (2.0 * m * m * n + m * m * m) + 6.0 * m * n;
}

double Muon::lr_ratio(const std::string& adjust_lr_fn, std::int64_t rows, std::int64_t cols) {
  const double a = static_cast<double>(rows), b = static_cast<double>(cols);
  if (adjust_lr_fn == "original") return std::sqrt(std::max(1.0, a / b));
  if (adjust_lr_fn == "match_rms_adamw") return 0.2 * std::sqrt(std::max(a, b));
  throw ValueError("Muon", "Adjust learning rate function " + adjust_lr_fn + " is not supported");
}

namespace kernels {
namespace {

// torch 1.13's CPU lerp with a scalar weight w: fma(w, end - self, self) for
// |w| < 0.5, fma(w - 1, end - self, end) otherwise. `Small` is |w| < 0.5;
// `wl` is w or w - 1 accordingly.
template <class T, bool Small>
DOPT_INLINE T lerp(T self, T end, T wl) {
  if constexpr (Small) return std::fma(wl, end - self, self);
  else return std::fma(wl, end - self, end);
}

// buf = lerp(buf, g, w_buf); u = nesterov ? lerp(g, buf, w_nes) : buf.
template <class T, bool SmallBuf, bool Nesterov, bool SmallNes>
DOPT_INLINE void momentum_body(T* __restrict buf, const T* __restrict g, T* __restrict u, i64 n, T wb, T wn) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, buf, g) {
    const T b = lerp<T, SmallBuf>(buf[i], g[i], wb);
    buf[i] = b;
    if constexpr (Nesterov) u[i] = lerp<T, SmallNes>(g[i], b, wn);
    else u[i] = b;
  }
}

template <class T>
DOPT_INLINE void momentum_select(T* buf, const T* g, T* u, i64 n, double w_buf, double w_nes, bool nesterov) {
  const bool sb = std::abs(w_buf) < 0.5, sn = std::abs(w_nes) < 0.5;
  // The weights as torch passes them (scalar_t), and w - 1 in scalar_t.
  const T wb = sb ? static_cast<T>(w_buf) : static_cast<T>(w_buf) - T(1);
  const T wn = sn ? static_cast<T>(w_nes) : static_cast<T>(w_nes) - T(1);
  if (!nesterov) {
    if (sb) momentum_body<T, true, false, true>(buf, g, u, n, wb, wn);
    else momentum_body<T, false, false, true>(buf, g, u, n, wb, wn);
  } else if (sb) {
    if (sn) momentum_body<T, true, true, true>(buf, g, u, n, wb, wn);
    else momentum_body<T, true, true, false>(buf, g, u, n, wb, wn);
  } else {
    if (sn) momentum_body<T, false, true, true>(buf, g, u, n, wb, wn);
    else momentum_body<T, false, true, false>(buf, g, u, n, wb, wn);
  }
}

// p = p * decay; p = p + neg_lr * O (torch: mul_, then add_ with alpha: one FMA).
template <class T>
DOPT_INLINE void apply_body(T* __restrict p, const T* __restrict o, i64 n, T decay, T neg_lr) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, o) { p[i] = std::fma(neg_lr, o[i], p[i] * decay); }
}

DOPT_KERNEL_ENTRY(muon_momentum, momentum_select, (buf, g, u, n, wb, wn, nes), T* buf, const T* g, T* u, i64 n, double wb,
                  double wn, bool nes)
DOPT_KERNEL_ENTRY(muon_apply, apply_body, (p, o, n, decay, neg_lr), T* p, const T* o, i64 n, T decay, T neg_lr)

}  // namespace
}  // namespace kernels

void Muon::init_param_state(const MuonOptions& /*o*/, const Tensor& p, ParamState& st) {
  st["momentum_buffer"] = Tensor::zeros(p.shape(), p.dtype(), p.device());
}

void Muon::update_param(const MuonOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "Muon.step";
  detail::require_cpu_param(p, op, "Muon");
  o.check_param(p, op);
  Tensor& buf = detail::matching_state_at(st, "momentum_buffer", p, op);
  const detail::NsPrecision precision = detail::parse_ns_precision(o.ns_dtype(), op);
  detail::check_newton_schulz_cpu(op);
  kernels::dispatch_float(p, op, [](auto) {});  // dtype errors before any change
  const std::int64_t rows = p.shape()[0], cols = p.shape()[1];
  const double adjusted_lr = o.lr() * lr_ratio(o.adjust_lr_fn(), rows, cols);
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    using kernels::sc;
    const kernels::i64 n = p.numel();
    std::vector<T> u(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
    kernels::muon_momentum(buf.template data<T>(), g.data<T>(), u.data(), n, 1.0 - o.momentum(), o.momentum(),
                           o.nesterov());
    detail::newton_schulz(u.data(), out.data(), rows, cols, o.ns_coefficients(), o.ns_steps(), o.eps(), precision);
    g_orthogonalizations.fetch_add(1, std::memory_order_relaxed);
    kernels::muon_apply(p.data<T>(), out.data(), n, sc<T>(1.0 - o.lr() * o.weight_decay()), sc<T>(-adjusted_lr));
  });
}

Tensor muon_newton_schulz(const Tensor& u, const Triple& coefficients, std::int64_t steps, double eps,
                          const std::string& ns_dtype) {
  const char* op = "muon_newton_schulz";
  if (!u.defined() || u.dim() != 2) throw ValueError(op, "expects a 2-D tensor, got " + (u.defined() ? u.str() : std::string("an undefined tensor")));
  if (steps < 0) throw ValueError(op, "steps must be >= 0, got " + std::to_string(steps));
  const detail::NsPrecision precision = detail::parse_ns_precision(ns_dtype, op);
  detail::check_newton_schulz_cpu(op);
  const Tensor& in = u;
  Tensor out = Tensor::zeros(u.shape(), u.dtype(), u.device());
  kernels::dispatch_float(in, op, [&](auto tag) {
    using T = decltype(tag);
    detail::newton_schulz(in.data<T>(), out.data<T>(), u.shape()[0], u.shape()[1], coefficients, steps, eps,
                          precision);
  });
  g_orthogonalizations.fetch_add(1, std::memory_order_relaxed);
  return out;
}

std::int64_t muon_orthogonalizations() noexcept { return g_orthogonalizations.load(std::memory_order_relaxed); }

}  // namespace dopt::optim
