// Muon's Newton-Schulz iteration with Eigen's matrix products.
//
// Why Eigen: it is already a build dependency (header only, nothing to ship),
// its products run on the calling thread only (dopt runs one thread per rank
// and spreads parameters over its own threads, so a BLAS with its own thread
// pool would oversubscribe the cores or serialise concurrent callers), and a
// product's rounding depends only on the shapes, never on thread counts, so
// every rank that orthogonalises a matrix gets the same bits. Debian's
// OpenBLAS or BLIS would also replace the system's libblas.so.3 through the
// alternatives system, changing the speed of every other program on the
// machine (torch included) behind its back.
//
// Speed: on x86-64 this one file is compiled for AVX2 + FMA (CMake option
// DOPT_MUON_AVX2, on by default), where Eigen's products run about four
// times faster than with the baseline SSE2; Muon checks the CPU before
// calling in (muon.cpp) and refuses to run without those instructions. The
// file includes nothing but Eigen and defines only functions on raw
// pointers, so no inline function compiled for AVX2 is shared with the rest
// of the library. Eigen is included nowhere else.
#include "newton_schulz.hpp"

#include <Eigen/Core>
#include <cstdint>
#include <cstring>

namespace dopt::optim::detail {
namespace {

// round_to_bfloat16, kept local to this file (see above).
inline float bf16(float x) noexcept {
  if (x != x) return x;  // NaN
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  bits &= 0xFFFF0000u;
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}

template <class W>
using Mat = Eigen::Matrix<W, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class W>
void round_bf16(Mat<W>& m) {
  if constexpr (std::is_same_v<W, float>) {
    float* d = m.data();
    const Eigen::Index n = m.size();
    for (Eigen::Index i = 0; i < n; ++i) d[i] = bf16(d[i]);
  }
}

// X is [m, n] with m <= n, in working precision W; iterates in place.
template <class W, bool Bf16>
void iterate(Mat<W>& X, const std::array<double, 3>& abc, std::int64_t steps, double eps) {
  auto rnd = [](W v) -> W {
    if constexpr (Bf16) return bf16(v);
    else return v;
  };
  // X / max(||X||_F, eps): torch's X.div_(X.norm().clamp(min=eps)).
  W norm = rnd(static_cast<W>(X.norm()));
  const W e = rnd(static_cast<W>(eps));
  if (norm < e) norm = e;
  X /= norm;
  if constexpr (Bf16) round_bf16(X);
  const W a = static_cast<W>(abc[0]), b = static_cast<W>(abc[1]), c = static_cast<W>(abc[2]);
  const Eigen::Index m = X.rows();
  Mat<W> G(m, m), GG(m, m), Y(X.rows(), X.cols());
  for (std::int64_t s = 0; s < steps; ++s) {
    G.noalias() = X * X.transpose();
    if constexpr (Bf16) round_bf16(G);
    GG.noalias() = G * G;
    G = b * G + c * GG;  // torch: addmm(G, G, G, beta=b, alpha=c)
    if constexpr (Bf16) round_bf16(G);
    Y.noalias() = G * X;
    X = a * X + Y;  // torch: addmm(X, G, X, beta=a)
    if constexpr (Bf16) round_bf16(X);
  }
}

template <class T, class W, bool Bf16>
void run(const T* u, T* out, std::int64_t rows, std::int64_t cols, const std::array<double, 3>& abc,
         std::int64_t steps, double eps) {
  using In = Eigen::Map<const Mat<T>>;
  using Out = Eigen::Map<Mat<T>>;
  In U(u, rows, cols);
  const bool tall = rows > cols;  // work on the smaller Gram matrix
  Mat<W> X = tall ? Mat<W>(U.transpose().template cast<W>()) : Mat<W>(U.template cast<W>());
  if constexpr (Bf16) round_bf16(X);
  iterate<W, Bf16>(X, abc, steps, eps);
  Out O(out, rows, cols);
  if (tall) O = X.transpose().template cast<T>();
  else O = X.template cast<T>();
}

template <class T>
void dispatch(const T* u, T* out, std::int64_t rows, std::int64_t cols, const std::array<double, 3>& abc,
              std::int64_t steps, double eps, NsPrecision precision) {
  if (rows == 0 || cols == 0) return;
  switch (precision) {
    case NsPrecision::float64: run<T, double, false>(u, out, rows, cols, abc, steps, eps); return;
    case NsPrecision::float32: run<T, float, false>(u, out, rows, cols, abc, steps, eps); return;
    case NsPrecision::bfloat16: run<T, float, true>(u, out, rows, cols, abc, steps, eps); return;
  }
}

}  // namespace

void newton_schulz(const double* u, double* out, std::int64_t rows, std::int64_t cols,
                   const std::array<double, 3>& abc, std::int64_t steps, double eps, NsPrecision precision) {
  dispatch(u, out, rows, cols, abc, steps, eps, precision);
}
void newton_schulz(const float* u, float* out, std::int64_t rows, std::int64_t cols,
                   const std::array<double, 3>& abc, std::int64_t steps, double eps, NsPrecision precision) {
  dispatch(u, out, rows, cols, abc, steps, eps, precision);
}

}  // namespace dopt::optim::detail
