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

template <ReduceOp Op, class A>
inline A combine(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    else if constexpr (Op == ReduceOp::product) return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
    else if constexpr (Op == ReduceOp::min) return b < a ? b : a;
    else return a < b ? b : a;
  } else {
    if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) return a + b;
    else if constexpr (Op == ReduceOp::product) return a * b;
    else if constexpr (Op == ReduceOp::min) return (b < a || b != b) ? b : a;  // NaN propagates
    else return (a < b || b != b) ? b : a;
  }
}

// The op is a template parameter so that the inner loops have no branch on
// it and vectorise.
template <class T, ReduceOp Op>
void reduce_typed(const std::vector<const void*>& ins, const std::vector<void*>& outs, std::int64_t lo,
                  std::int64_t count) {
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
      for (std::int64_t i = 0; i < m; ++i) acc[i] = combine<Op, A>(acc[i], load(in[i]));
    }
    if constexpr (!std::is_integral_v<A>) {
      if constexpr (Op == ReduceOp::avg) {
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
      switch (op) {
        case ReduceOp::sum: return reduce_typed<T, ReduceOp::sum>(ins, outs, lo, count);
        case ReduceOp::avg: return reduce_typed<T, ReduceOp::avg>(ins, outs, lo, count);
        case ReduceOp::product: return reduce_typed<T, ReduceOp::product>(ins, outs, lo, count);
        case ReduceOp::min: return reduce_typed<T, ReduceOp::min>(ins, outs, lo, count);
        case ReduceOp::max: return reduce_typed<T, ReduceOp::max>(ins, outs, lo, count);
      }
    }
  });
}

}  // namespace dopt::detail
