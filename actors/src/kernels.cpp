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
/// x / d in T's own arithmetic, as torch's `tensor / d` (16-bit floats: in
/// float, rounded to T).
template <class T>
inline acc_t<T> divided(const T& x, std::int64_t d) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return load(T(static_cast<float>(x) / static_cast<float>(d)));
  } else if constexpr (std::is_floating_point_v<T>) {
    return x / static_cast<T>(d);
  } else {
    return static_cast<T>(x / static_cast<T>(d));
  }
}

template <class T, ReduceOp Op>
void reduce_typed(const std::vector<const void*>& ins, const std::vector<void*>& outs, std::int64_t lo,
                  std::int64_t count, std::int64_t pre_divisor = 0) {
  using A = acc_t<T>;
  constexpr std::int64_t B = 1024;
  std::array<A, B> acc;
  const std::size_t n = ins.size();
  for (std::int64_t start = lo; start < lo + count; start += B) {
    const std::int64_t m = std::min(B, lo + count - start);
    const T* in0 = static_cast<const T*>(ins[0]) + start;
    if (pre_divisor > 0) {
      for (std::int64_t i = 0; i < m; ++i) acc[i] = divided(in0[i], pre_divisor);
      for (std::size_t k = 1; k < n; ++k) {
        const T* in = static_cast<const T*>(ins[k]) + start;
        for (std::int64_t i = 0; i < m; ++i) acc[i] = combine<Op, A>(acc[i], divided(in[i], pre_divisor));
      }
    } else {
      for (std::int64_t i = 0; i < m; ++i) acc[i] = load(in0[i]);
      for (std::size_t k = 1; k < n; ++k) {
        const T* in = static_cast<const T*>(ins[k]) + start;
        for (std::int64_t i = 0; i < m; ++i) acc[i] = combine<Op, A>(acc[i], load(in[i]));
      }
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

template <class T>
void reduce_dispatch(ReduceOp op, const std::vector<const void*>& ins, const std::vector<void*>& outs,
                     std::int64_t lo, std::int64_t count, std::int64_t pre_divisor) {
  switch (op) {
    case ReduceOp::sum: return reduce_typed<T, ReduceOp::sum>(ins, outs, lo, count, pre_divisor);
    case ReduceOp::avg: return reduce_typed<T, ReduceOp::avg>(ins, outs, lo, count, pre_divisor);
    case ReduceOp::product: return reduce_typed<T, ReduceOp::product>(ins, outs, lo, count, pre_divisor);
    case ReduceOp::min: return reduce_typed<T, ReduceOp::min>(ins, outs, lo, count, pre_divisor);
    case ReduceOp::max: return reduce_typed<T, ReduceOp::max>(ins, outs, lo, count, pre_divisor);
  }
}

}  // namespace

void reduce_members(const ReduceSpec& spec, const std::vector<const void*>& ins, const std::vector<void*>& outs,
                    std::int64_t global_lo, std::int64_t count) {
  if (count <= 0 || ins.empty()) return;
  auto run = [&](const std::vector<const void*>& in, const std::vector<void*>& out, std::int64_t off,
                 std::int64_t cnt) {
    dispatch_dtype(spec.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        throw DTypeError("reduce", "bool tensors cannot be reduced");
      } else {
        reduce_dispatch<T>(spec.op, in, out, off, cnt, spec.pre_divisor);
      }
    });
  };
  const std::int64_t n = static_cast<std::int64_t>(ins.size());
  const bool ring = spec.order == ReduceOrder::ring && n >= 3 &&  // two ranks: a + b == b + a
                    (spec.dtype == DType::float32 || spec.dtype == DType::float64);
  if (!ring) {
    run(ins, outs, 0, count);
    return;
  }
  // gloo's ring: the flat buffer is cut into 2n segments of ceil(bytes / 2n)
  // bytes (whole elements); rank c owns segments 2c and 2c + 1, and their sum
  // starts at rank c + 1 and goes round the ring to rank c.
  const std::int64_t es = static_cast<std::int64_t>(itemsize(spec.dtype));
  std::int64_t seg_bytes = (spec.total * es + 2 * n - 1) / (2 * n);
  seg_bytes = (seg_bytes + es - 1) / es * es;
  const std::int64_t span = std::max<std::int64_t>(1, 2 * (seg_bytes / es));  // elements of one rank's pair
  std::vector<const void*> rot(ins.size());
  std::int64_t done = 0;
  while (done < count) {
    const std::int64_t g = global_lo + done;
    const std::int64_t c = std::min<std::int64_t>(g / span, n - 1);
    const std::int64_t end = c == n - 1 ? global_lo + count : std::min(global_lo + count, (c + 1) * span);
    const std::int64_t cnt = end - g;
    for (std::int64_t j = 0; j < n; ++j) rot[static_cast<std::size_t>(j)] = ins[static_cast<std::size_t>((c + 1 + j) % n)];
    run(rot, outs, done, cnt);
    done += cnt;
  }
}

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
