#include "dopt/optim/internal/state_check.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <sstream>

#include "dopt/runtime/error.hpp"

namespace dopt::optim {
namespace {

bool never_negative(const std::string& key) {
  static const std::set<std::string> keys = {"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum",
                                             "acc_delta",  "exp_inf",        "step_size",  "step"};
  return keys.count(key) > 0;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream ss;
  ss.precision(9);
  ss << v;
  return ss.str();
}

/// Index of the first bad element of a float32 array, or -1. A branch-free
/// pass (vectorised by the compiler) decides; only a bad array is searched.
std::int64_t first_bad_f32(const float* p, std::int64_t n, bool nonneg) {
  const auto* u = reinterpret_cast<const std::uint32_t*>(p);
  std::uint32_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    bad |= static_cast<std::uint32_t>((u[i] & 0x7f800000u) == 0x7f800000u);        // NaN or Inf
    if (nonneg) bad |= static_cast<std::uint32_t>(u[i] > 0x80000000u);              // < 0 (not -0)
  }
  if (!bad) return -1;
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]) || (nonneg && p[i] < 0)) return i;
  return -1;
}

std::int64_t first_bad_f64(const double* p, std::int64_t n, bool nonneg) {
  const auto* u = reinterpret_cast<const std::uint64_t*>(p);
  std::uint64_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    bad |= static_cast<std::uint64_t>((u[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull);
    if (nonneg) bad |= static_cast<std::uint64_t>(u[i] > 0x8000000000000000ull);
  }
  if (!bad) return -1;
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]) || (nonneg && p[i] < 0)) return i;
  return -1;
}

}  // namespace

std::string find_impossible_state(const std::string& key, const Tensor& value) {
  if (!value.defined() || value.numel() == 0) return {};
  const bool nonneg = never_negative(key);
  const DType dt = value.dtype();
  if (!is_floating_point(dt) && (!nonneg || dt == DType::bool_ || dt == DType::uint8)) return {};
  Tensor v = value.device().is_cpu() ? value : value.to(Device::cpu());
  if (dt == DType::float16 || dt == DType::bfloat16) v = v.to(DType::float32);
  if (!is_floating_point(dt)) v = v.to(DType::float64);  // integer counters: only the sign matters
  const std::int64_t n = v.numel();
  std::int64_t at = -1;
  if (v.dtype() == DType::float32) at = first_bad_f32(v.data<float>(), n, nonneg);
  else at = first_bad_f64(v.data<double>(), n, nonneg);
  if (at < 0) return {};
  const double x = v.at(at);
  std::string out = "holds " + number(x) + " at element " + std::to_string(at) + " of " + std::to_string(n);
  if (std::isfinite(x)) out += ", but '" + key + "' is never negative";
  return out;
}

void check_state_value(const std::string& op, const std::string& what, const std::string& key,
                       const Tensor& value) {
  const std::string problem = find_impossible_state(key, value);
  if (problem.empty()) return;
  throw StateDictError(op, what + " " + problem +
                               "; an optimizer step never produces this, so the checkpoint is corrupt or was "
                               "saved after training diverged");
}

}  // namespace dopt::optim
