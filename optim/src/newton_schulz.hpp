#pragma once
// Internal: Muon's Newton-Schulz iteration on raw row-major matrices
// (newton_schulz.cpp, the only source that includes Eigen).
#include <array>
#include <cstdint>
#include <string>

namespace dopt::optim::detail {

enum class NsPrecision { float64, float32, bfloat16 };

/// "float64" / "float32" / "bfloat16"; ValueError naming `op` otherwise.
/// (This and the functions below the iteration live in muon.cpp.)
NsPrecision parse_ns_precision(const std::string& name, const char* op);

/// out = NS(u) for a row-major [rows, cols] matrix u (out has the same shape
/// and may not alias u): X = u (transposed when rows > cols), converted to the
/// precision; X /= max(||X||_F, eps); `steps` times G = X X^T,
/// X = a X + (b G + c G G) X; transposed back and converted to T.
void newton_schulz(const double* u, double* out, std::int64_t rows, std::int64_t cols,
                   const std::array<double, 3>& abc, std::int64_t steps, double eps, NsPrecision precision);
void newton_schulz(const float* u, float* out, std::int64_t rows, std::int64_t cols,
                   const std::array<double, 3>& abc, std::int64_t steps, double eps, NsPrecision precision);

/// Rounds a float to the nearest bfloat16 (ties to even), kept as a float.
float round_to_bfloat16(float x) noexcept;

/// NotSupportedError naming `op` when newton_schulz was compiled for
/// instructions this CPU lacks (DOPT_MUON_AVX2); call before newton_schulz.
void check_newton_schulz_cpu(const char* op);

}  // namespace dopt::optim::detail
