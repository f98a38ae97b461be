#pragma once
// Deterministic test data: the same values on every rank, in every process
// and in every run, from a seed, for the unit tests, the rank programs of the
// multi-process tests and their references. Pure functions; any thread.
#include <cstdint>
#include <string>
#include <vector>

#include "dopt/runtime/tensor.hpp"

namespace dopt::testing {

/// The parameter size of the reference comparisons: two 16-float vector
/// chunks plus a scalar tail.
constexpr std::size_t kRefNumel = 37;

/// n deterministic values in [-scale, scale), different for each seed.
template <class T>
std::vector<T> values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  std::vector<T> out(n);
  for (auto& v : out) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    const double u = static_cast<double>(x >> 11) / 9007199254740992.0;  // [0, 1)
    v = static_cast<T>((2.0 * u - 1.0) * scale);
  }
  return out;
}

/// splitmix64's finaliser: a well-mixed 64-bit value of x.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A 1-d tensor of v (or of `shape`), with its own storage.
template <class T>
Tensor tensor_of(const std::vector<T>& v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<std::int64_t>(v.size())};
  return Tensor::from_vector(v, std::move(shape));
}

/// `count` float32 parameters of uneven sizes first, first + stride, ...
/// (so that shards and buckets differ between ranks), parameter k filled with
/// values(.., seed + k).
inline std::vector<Tensor> uneven_params(int count, std::size_t first, std::size_t stride, std::uint64_t seed) {
  std::vector<Tensor> ps;
  for (int k = 0; k < count; ++k)
    ps.push_back(tensor_of(values<float>(first + stride * static_cast<std::size_t>(k), seed + static_cast<std::uint64_t>(k))));
  return ps;
}

/// The gradients of the clip_grad tests (optim's and ZeRO's, which must clip
/// alike): vectors of 1 to 1031 values (odd sizes, vector chunks and tails),
/// values(.., seed + k, scale) for vector k.
template <class T>
std::vector<std::vector<T>> clip_grads(std::uint64_t seed, double scale) {
  std::vector<std::vector<T>> g;
  for (std::size_t n : {1, 3, 4, 5, 7, 8, 12, 13, 17, 64, 100, 1031}) g.push_back(values<T>(n, seed + g.size(), scale));
  return g;
}

}  // namespace dopt::testing
