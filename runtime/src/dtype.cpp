#include "dopt/runtime/dtype.hpp"

#include <cmath>

#include "dopt/runtime/error.hpp"

namespace dopt {

std::size_t itemsize(DType dt) noexcept {
  switch (dt) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::float16: return 2;
    case DType::bfloat16: return 2;
    case DType::int8: return 1;
    case DType::uint8: return 1;
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::bool_: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dt) noexcept {
  switch (dt) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int8: return "int8";
    case DType::uint8: return "uint8";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::bool_: return "bool";
  }
  return "?";
}

std::string_view safetensors_name(DType dt) noexcept {
  switch (dt) {
    case DType::float32: return "F32";
    case DType::float64: return "F64";
    case DType::float16: return "F16";
    case DType::bfloat16: return "BF16";
    case DType::int8: return "I8";
    case DType::uint8: return "U8";
    case DType::int32: return "I32";
    case DType::int64: return "I64";
    case DType::bool_: return "BOOL";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType dt : {DType::float32, DType::float64, DType::float16, DType::bfloat16, DType::int8,
                   DType::uint8, DType::int32, DType::int64, DType::bool_}) {
    if (name == dtype_name(dt) || name == safetensors_name(dt)) return dt;
  }
  throw DTypeError("dtype_from_name", "unknown dtype '" + std::string(name) + "'");
}

bool is_floating_point(DType dt) noexcept {
  return dt == DType::float32 || dt == DType::float64 || dt == DType::float16 ||
         dt == DType::bfloat16;
}

std::uint16_t float_to_half(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (x < 0x38800000u) {                                                   // subnormal half
    // value = x as float; half subnormal unit = 2^-24
    float af;
    std::memcpy(&af, &x, 4);
    const float scaled = af * 16777216.0f;  // exact: multiply by 2^24
    const auto m = static_cast<std::uint32_t>(std::nearbyint(scaled));
    return static_cast<std::uint16_t>(sign | m);
  }
  // normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits (nearest even)
  const std::uint32_t lsb = (x >> 13) & 1u;
  x += 0xfffu + lsb;
  const std::uint32_t h = ((x >> 13) - (112u << 10));
  return static_cast<std::uint16_t>(sign | h);
}

float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (std::uint32_t(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  std::uint32_t out;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    std::memcpy(&out, &v, 4);
    out |= sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

std::uint16_t float_to_bfloat16(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<std::uint16_t>(x >> 16);
}

float bfloat16_to_float(std::uint16_t b) noexcept {
  const std::uint32_t x = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace dopt
