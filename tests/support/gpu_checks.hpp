#pragma once
// Checks of the GPU tests (gpu/src/*.test.cpp): a test that needs a CUDA
// device returns early without one. The message is what tests/CMakeLists.txt
// matches (SKIP_REGULAR_EXPRESSION) to report the test as skipped.
//
// And the comparison of GPU results with the CPU path under dopt's NaN
// contract on CUDA: every value bit for bit, except that a NaN matches any
// NaN. CUDA's float arithmetic and conversions return the canonical NaN where
// x86 keeps the sign and payload of an input NaN, so a NaN stays a NaN on the
// GPU (never becomes a number, never a number becomes NaN) but its sign and
// payload are unspecified (docs/gpu.md, "NaN").
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>

#include "dopt/gpu/device.hpp"
#include "dopt/runtime/tensor.hpp"

#define DOPT_REQUIRE_CUDA()                      \
  do {                                           \
    if (!::dopt::gpu::init()) {                  \
      WARN("skipped: no CUDA device");           \
      SUCCEED("skipped: no CUDA device");        \
      return;                                    \
    }                                            \
  } while (0)

namespace dopt::testing {

/// Whether the Bits at `p` without the sign (`magnitude` masks it off) are
/// above `inf`, the bits of infinity: a NaN.
template <class Bits>
bool above_inf_bits(const unsigned char* p, Bits magnitude, Bits inf) {
  Bits x;
  std::memcpy(&x, p, sizeof x);
  return (x & magnitude) > inf;
}

/// Whether the element of dtype `dt` at `p` is a NaN (floating dtypes; false otherwise).
inline bool is_nan_bits(const unsigned char* p, DType dt) {
  switch (dt) {
    case DType::float32: return above_inf_bits<std::uint32_t>(p, 0x7fffffffu, 0x7f800000u);
    case DType::float64: return above_inf_bits<std::uint64_t>(p, 0x7fffffffffffffffull, 0x7ff0000000000000ull);
    case DType::float16: return above_inf_bits<std::uint16_t>(p, 0x7fffu, 0x7c00u);
    case DType::bfloat16: return above_inf_bits<std::uint16_t>(p, 0x7fffu, 0x7f80u);
    default: return false;
  }
}

/// Same dtype, same numel and every element bit for bit, a NaN matching any NaN (any devices).
inline bool same_bits_nan_as_class(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel() || a.dtype() != b.dtype()) return false;
  if (a.numel() == 0) return true;
  const Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  const std::size_t w = ha.element_size();
  const auto* pa = static_cast<const unsigned char*>(ha.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(hb.data_ptr());
  for (std::int64_t i = 0; i < ha.numel(); ++i, pa += w, pb += w) {
    if (std::memcmp(pa, pb, w) == 0) continue;
    if (!(is_nan_bits(pa, ha.dtype()) && is_nan_bits(pb, hb.dtype()))) return false;
  }
  return true;
}

}  // namespace dopt::testing
