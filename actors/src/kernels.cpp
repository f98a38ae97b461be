#include "kernels.hpp"

#include <algorithm>
#include <array>
#include <type_traits>

#include "dopt/runtime/error.hpp"

namespace dopt::detail {
namespace {

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

template <class T>
inline acc_t<T> load(const T& v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<float>(v);
  else return v;
}
template <class T>
inline T store(acc_t<T> v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return T(v);
  else return v;
}

template <class A>
inline A combine(ReduceOp op, A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
      case ReduceOp::product: return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
      case ReduceOp::min: return b < a ? b : a;
      case ReduceOp::max: return a < b ? b : a;
    }
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return a + b;
      case ReduceOp::product: return a * b;
      case ReduceOp::min: return (b < a || b != b) ? b : a;  // NaN propagates
      case ReduceOp::max: return (a < b || b != b) ? b : a;
    }
  }
  return a;
}

template <class T>
void reduce_typed(ReduceOp op, const std::vector<const void*>& ins, const std::vector<void*>& outs,
                  std::int64_t lo, std::int64_t count) {
  using A = acc_t<T>;
  constexpr std::int64_t B = 1024;
  std::array<A, B> acc;
  const std::size_t n = ins.size();
  for (std::int64_t start = lo; start < lo + count; start += B) {
    const std::int64_t m = std::min(B, lo + count - start);
    const T* in0 = static_cast<const T*>(ins[0]) + start;
    for (std::int64_t i = 0; i < m; ++i) acc[i] = load(in0[i]);
    for (std::size_t k = 1; k < n; ++k) {
      const T* in = static_cast<const T*>(ins[k]) + start;
      for (std::int64_t i = 0; i < m; ++i) acc[i] = combine<A>(op, acc[i], load(in[i]));
    }
    if constexpr (!std::is_integral_v<A>) {
      if (op == ReduceOp::avg) {
        const A d = static_cast<A>(n);
        for (std::int64_t i = 0; i < m; ++i) acc[i] = acc[i] / d;
      }
    }
    for (void* o : outs) {
      T* out = static_cast<T*>(o) + start;
      for (std::int64_t i = 0; i < m; ++i) out[i] = store<T>(acc[i]);
    }
  }
}

}  // namespace

void reduce_range(ReduceOp op, DType dtype, const std::vector<const void*>& ins,
                  const std::vector<void*>& outs, std::int64_t lo, std::int64_t count) {
  if (count <= 0 || ins.empty()) return;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw DTypeError("reduce", "bool tensors cannot be reduced");
    } else {
      reduce_typed<T>(op, ins, outs, lo, count);
    }
  });
}

}  // namespace dopt::detail
