#pragma once
// Element types of dopt::Tensor and conversions between them.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace dopt {

enum class DType : std::uint8_t {
  float32,
  float64,
  float16,
  bfloat16,
  int8,
  uint8,
  int32,
  int64,
  bool_,
};

/// Bytes per element.
std::size_t itemsize(DType dt) noexcept;
/// torch-style name: "float32", "bfloat16", "int64", "bool".
std::string_view dtype_name(DType dt) noexcept;
/// safetensors name: "F32", "F64", "F16", "BF16", "I8", "U8", "I32", "I64", "BOOL".
std::string_view safetensors_name(DType dt) noexcept;
/// Parses either form above; throws dopt::DTypeError for an unknown name.
DType dtype_from_name(std::string_view name);
bool is_floating_point(DType dt) noexcept;

/// IEEE binary16 and bfloat16 <-> float32, round to nearest even, NaN kept.
std::uint16_t float_to_half(float f) noexcept;
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_bfloat16(float f) noexcept;
float bfloat16_to_float(std::uint16_t b) noexcept;

/// Storage types for the 16-bit floats (bit patterns, with conversions).
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) noexcept : bits(float_to_half(f)) {}
  explicit operator float() const noexcept { return half_to_float(bits); }
};
struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) noexcept : bits(float_to_bfloat16(f)) {}
  explicit operator float() const noexcept { return bfloat16_to_float(bits); }
};

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::float64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::float16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::bfloat16; };
template <> struct dtype_of<std::int8_t> { static constexpr DType value = DType::int8; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::uint8; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::int32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::int64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::bool_; };
template <class T> inline constexpr DType dtype_of_v = dtype_of<T>::value;

/// Calls f(T{}) with the C++ type of dt (Half/BFloat16 for the 16-bit floats).
template <class F>
decltype(auto) dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::float32: return f(float{});
    case DType::float64: return f(double{});
    case DType::float16: return f(Half{});
    case DType::bfloat16: return f(BFloat16{});
    case DType::int8: return f(std::int8_t{});
    case DType::uint8: return f(std::uint8_t{});
    case DType::int32: return f(std::int32_t{});
    case DType::int64: return f(std::int64_t{});
    case DType::bool_: return f(bool{});
  }
  return f(float{});
}

/// Converts one element to double / from double (16-bit floats via float).
template <class T> inline double to_double(T v) noexcept {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return double(float(v));
  else return static_cast<double>(v);
}
template <class T> inline T from_double(double v) noexcept {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != 0.0;
  else if constexpr (std::is_integral_v<T>) {
    // Saturate instead of the undefined behaviour of an out-of-range cast; NaN -> 0.
    if (!(v == v)) return T(0);
    if (v <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
    if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(v);
  } else return static_cast<T>(v);
}

}  // namespace dopt
