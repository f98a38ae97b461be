#pragma once
// Internal: building blocks of the fused CPU optimizer kernels.
//
// Exactness: every kernel reproduces torch 1.13's single-tensor float32
// operation order (spec section 3): scalars computed in double and rounded to
// the element type once; std::fma exactly where torch fuses; plain operations
// elsewhere. The build uses -ffp-contract=off so the compiler never fuses on
// its own, and -fno-math-errno so sqrt vectorises (sqrt stays correctly rounded).
//
// Speed: one pass over memory per tensor; each kernel is cloned for AVX-512,
// AVX2+FMA and baseline x86-64 and picked at load time (an element's result is
// the same in every clone, since FMA and sqrt are exact roundings).
#include <cmath>
#include <cstdint>

#include "dopt/runtime/tensor.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define DOPT_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DOPT_KERNEL
#endif

namespace dopt::optim::kernels {

using i64 = std::int64_t;

/// Rounds a double scalar to the element type once (torch's scalar cast).
template <class T> inline T sc(double v) noexcept { return static_cast<T>(v); }

/// Dispatches a float32/float64 CPU kernel; other dtypes/devices raise errors.
template <class F>
void dispatch_float(const Tensor& p, const char* op, F&& f) {
  if (!p.device().is_cpu())
    throw NotSupportedError(op, "no kernel for parameters on " + p.device().str() +
                                    " in this build (CUDA kernels live in gpu/)");
  switch (p.dtype()) {
    case DType::float32: f(float{}); return;
    case DType::float64: f(double{}); return;
    default:
      throw DTypeError(op, "CPU kernels support float32 and float64 parameters, got " +
                               std::string(dtype_name(p.dtype())));
  }
}

}  // namespace dopt::optim::kernels
