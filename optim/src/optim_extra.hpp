#pragma once
// Internal helpers of the optimizer sources (their state lookups, the refusal
// of a parameter off the CPU) and of the options' error texts.
#include <charconv>
#include <cmath>
#include <string>

#include "optim_util.hpp"

namespace dopt::optim::detail {

/// The state tensor under `key`, which must have p's shape and dtype
/// (dopt::StateError naming `op` otherwise, e.g. a foreign state dict).
inline Tensor& matching_state_at(ParamState& st, const char* key, const Tensor& p, const char* op) {
  Tensor& t = state_at(st, key, op);
  if (t.shape() != p.shape() || t.dtype() != p.dtype())
    throw StateError(op, std::string("state '") + key + "' " + t.str() + " does not match parameter " + p.str());
  return t;
}

/// The optimizers without device kernels refuse a parameter off the CPU
/// (dopt::NotSupportedError naming `optimizer`).
inline void require_cpu_param(const Tensor& p, const char* op, const char* optimizer) {
  if (!p.device().is_cpu())
    throw NotSupportedError(op, std::string(optimizer) + " has no kernel for parameters on " + p.device().str() +
                                    " (it runs on the CPU only)");
}

/// Python's repr of a float ("0.5", "1.0", "1e-06", "inf"), for error texts
/// that quote torch's `"...{}".format(x)` messages.
inline std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::string s;
  std::to_chars_result res;
  // Shortest round-trip digits, as Python; Python switches to exponent notation from 1e16 and below 1e-4.
  const double a = std::fabs(v);
  if (a != 0.0 && (a >= 1e16 || a < 1e-4)) {
    res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    s.assign(buf, res.ptr);
    return s;  // to_chars writes "1e-06" / "1.5e+16", as Python does
  }
  res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  s.assign(buf, res.ptr);
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

}  // namespace dopt::optim::detail
