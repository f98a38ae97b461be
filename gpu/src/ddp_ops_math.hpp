#pragma once
// Internal to dopt_gpu: the element-wise arithmetic of the DDP device ops
// (ddp_ops_kernels.cu), written once for host and device so that the CPU
// unit tests check the very code the kernels run against the runtime's
// conversions (runtime/src/dtype.cpp) and the reducer's division
// (distributed/src/ddp/plsgd_util.hpp divide_). No dopt headers: built as CUDA C++17.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DOPT_DDP_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define DOPT_DDP_HD inline
#endif

namespace dopt::gpu::detail::ddp {

/// dtype codes: dopt::DType's values.
enum Code : int { kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3 };

DOPT_DDP_HD std::uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
#endif
}

DOPT_DDP_HD float float_of(std::uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(x);
#else
  float f;
  std::memcpy(&f, &x, 4);
  return f;
#endif
}

/// runtime's float_to_half: round to nearest even, NaN -> sign | 0x7e00, overflow -> inf.
DOPT_DDP_HD std::uint16_t f32_to_f16(float f) {
  std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (x < 0x38800000u) {
    const float scaled = float_of(x) * 16777216.0f;  // exact: times 2^24
#if defined(__CUDA_ARCH__)
    const auto m = static_cast<std::uint32_t>(rintf(scaled));  // nearest even, as std::nearbyint
#else
    const auto m = static_cast<std::uint32_t>(std::nearbyint(scaled));
#endif
    return static_cast<std::uint16_t>(sign | m);
  }
  const std::uint32_t lsb = (x >> 13) & 1u;
  x += 0xfffu + lsb;
  return static_cast<std::uint16_t>(sign | ((x >> 13) - (112u << 10)));
}

/// runtime's half_to_float (exact).
DOPT_DDP_HD float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  std::uint32_t out;
  if (exp == 0) {
    out = bits_of(static_cast<float>(man) * 5.9604644775390625e-8f) | sign;  // man * 2^-24, exact
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (man << 13);
  }
  return float_of(out);
}

/// runtime's float_to_bfloat16: round to nearest even, NaN -> (bits >> 16) | 0x40.
DOPT_DDP_HD std::uint16_t f32_to_bf16(float f) {
  std::uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<std::uint16_t>(x >> 16);
}

DOPT_DDP_HD float bf16_to_f32(std::uint16_t b) { return float_of(std::uint32_t(b) << 16); }

/// a / d (float or double) rounded to nearest, on the device as on the host.
template <class F>
DOPT_DDP_HD F div_rn(F a, F d) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(F) == sizeof(float)) return __fdiv_rn(a, d);
  else return __ddiv_rn(a, d);
#else
  return a / d;
#endif
}

DOPT_DDP_HD float f64_to_f32(double v) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(v);
#else
  return static_cast<float>(v);
#endif
}

/// Element i of `p` (code `c`) divided by n, the CPU path's arithmetic:
/// float32/float64 in their own type, 16-bit widened to float32, divided, rounded.
DOPT_DDP_HD void divide_at(void* p, int c, long long i, long long n) {
  switch (c) {
    case kF32: {
      float* q = static_cast<float*>(p);
      q[i] = div_rn(q[i], static_cast<float>(n));
      return;
    }
    case kF64: {
      double* q = static_cast<double*>(p);
      q[i] = div_rn(q[i], static_cast<double>(n));
      return;
    }
    case kF16: {
      std::uint16_t* q = static_cast<std::uint16_t*>(p);
      q[i] = f32_to_f16(div_rn(f16_to_f32(q[i]), static_cast<float>(n)));
      return;
    }
    case kBF16: {
      std::uint16_t* q = static_cast<std::uint16_t*>(p);
      q[i] = f32_to_bf16(div_rn(bf16_to_f32(q[i]), static_cast<float>(n)));
      return;
    }
    default:
      return;
  }
}

/// dst[i] = src[i] converted as Tensor::copy_ on the CPU: 16-bit sources
/// widen to float32 (exact); float64 goes to 16 bits through float32.
DOPT_DDP_HD void convert_at(void* dst, int dc, const void* src, int sc, long long i) {
  if (sc == kF64) {
    const double v = static_cast<const double*>(src)[i];
    switch (dc) {
      case kF64: static_cast<double*>(dst)[i] = v; return;
      case kF32: static_cast<float*>(dst)[i] = f64_to_f32(v); return;
      case kF16: static_cast<std::uint16_t*>(dst)[i] = f32_to_f16(f64_to_f32(v)); return;
      case kBF16: static_cast<std::uint16_t*>(dst)[i] = f32_to_bf16(f64_to_f32(v)); return;
      default: return;
    }
  }
  float v = 0.0f;
  switch (sc) {
    case kF32: v = static_cast<const float*>(src)[i]; break;
    case kF16: v = f16_to_f32(static_cast<const std::uint16_t*>(src)[i]); break;
    case kBF16: v = bf16_to_f32(static_cast<const std::uint16_t*>(src)[i]); break;
    default: return;
  }
  switch (dc) {
    case kF64: static_cast<double*>(dst)[i] = static_cast<double>(v); return;
    case kF32: static_cast<float*>(dst)[i] = v; return;
    case kF16: static_cast<std::uint16_t*>(dst)[i] = f32_to_f16(v); return;
    case kBF16: static_cast<std::uint16_t*>(dst)[i] = f32_to_bf16(v); return;
    default: return;
  }
}

}  // namespace dopt::gpu::detail::ddp
