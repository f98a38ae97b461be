#include "plane/kernels.hpp"

#include <algorithm>
#include <array>
#include <type_traits>

#include "dopt/runtime/error.hpp"
#include "dopt/actors/internal/op.hpp"

namespace dopt::detail {

ReduceSpec reduce_spec_of(const Op& op, std::int64_t total) {
  return ReduceSpec{op.desc.op, op.desc.dtype, op.desc.order, op.desc.pre_divisor, total};
}
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

/// f.template operator()<T, Op>() for the dtype's C++ type T and the op
/// (a templated lambda); bool tensors cannot be reduced.
template <class F>
void dispatch_reduce(ReduceOp op, DType dtype, F&& f) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw DTypeError("reduce", "bool tensors cannot be reduced");
    } else {
      switch (op) {
        case ReduceOp::sum: return f.template operator()<T, ReduceOp::sum>();
        case ReduceOp::avg: return f.template operator()<T, ReduceOp::avg>();
        case ReduceOp::product: return f.template operator()<T, ReduceOp::product>();
        case ReduceOp::min: return f.template operator()<T, ReduceOp::min>();
        case ReduceOp::max: return f.template operator()<T, ReduceOp::max>();
      }
    }
  });
}

template <class T, ReduceOp Op>
void accumulate_typed(std::int64_t pre_divisor, const void* acc_in, const std::vector<const void*>& ins, void* acc_out,
                      std::int64_t count) {
  using A = acc_t<T>;
  const A* a_in = static_cast<const A*>(acc_in);
  A* a_out = static_cast<A*>(acc_out);
  auto contribution = [&](const T* p, std::int64_t i) { return pre_divisor > 0 ? divided(p[i], pre_divisor) : load(p[i]); };
  std::size_t k0 = 0;
  if (!a_in) {
    const T* in0 = static_cast<const T*>(ins[0]);
    for (std::int64_t i = 0; i < count; ++i) a_out[i] = contribution(in0, i);
    k0 = 1;
  } else if (a_in != a_out) {
    for (std::int64_t i = 0; i < count; ++i) a_out[i] = a_in[i];
  }
  for (std::size_t k = k0; k < ins.size(); ++k) {
    const T* in = static_cast<const T*>(ins[k]);
    for (std::int64_t i = 0; i < count; ++i) a_out[i] = combine<Op, A>(a_out[i], contribution(in, i));
  }
}

template <class T, ReduceOp Op>
void finalize_typed(std::int64_t n, const void* acc, void* out, std::int64_t count) {
  using A = acc_t<T>;
  const A* a = static_cast<const A*>(acc);
  T* o = static_cast<T*>(out);
  for (std::int64_t i = 0; i < count; ++i) {
    A v = a[i];
    if constexpr (!std::is_integral_v<A>) {
      if constexpr (Op == ReduceOp::avg) v = v / static_cast<A>(n);
    }
    o[i] = store<T>(v);
  }
}

}  // namespace

std::size_t acc_itemsize(DType dtype) {
  return dtype == DType::float16 || dtype == DType::bfloat16 ? sizeof(float) : itemsize(dtype);
}

void accumulate(ReduceOp op, DType dtype, std::int64_t pre_divisor, const void* acc_in,
                const std::vector<const void*>& ins, void* acc_out, std::int64_t count) {
  if (count <= 0 || (ins.empty() && !acc_in)) return;
  dispatch_reduce(op, dtype, [&]<class T, ReduceOp Op>() {
    accumulate_typed<T, Op>(pre_divisor, acc_in, ins, acc_out, count);
  });
}

void finalize(ReduceOp op, DType dtype, std::int64_t n, const void* acc, void* out, std::int64_t count) {
  if (count <= 0) return;
  dispatch_reduce(op, dtype, [&]<class T, ReduceOp Op>() { finalize_typed<T, Op>(n, acc, out, count); });
}

std::vector<RankRun> reduction_order(const ReduceSpec& spec, int n, std::int64_t lo, std::int64_t count) {
  std::vector<RankRun> out;
  const bool ring = spec.order == ReduceOrder::ring && n >= 3 &&
                    (spec.dtype == DType::float32 || spec.dtype == DType::float64);
  if (!ring) {
    RankRun r{lo, count, {}};
    for (int g = 0; g < n; ++g) r.order.push_back(g);
    out.push_back(std::move(r));
    return out;
  }
  const std::int64_t es = static_cast<std::int64_t>(itemsize(spec.dtype));
  const std::int64_t T = spec.total * es;
  auto round_up = [](std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; };
  const std::int64_t max_seg = es * ((std::int64_t{1} << 20) / es);
  const std::int64_t seg0 = round_up(std::min((T + 2 * n - 1) / (2 * n), max_seg), es);
  const std::int64_t nseg = round_up(std::max((T + seg0 - 1) / seg0, std::int64_t{2} * n), n);
  const std::int64_t seg = round_up((T + nseg - 1) / nseg, es);
  const std::int64_t span = std::max<std::int64_t>(1, (nseg / n) * seg / es);
  std::int64_t done = 0;
  while (done < count) {
    const std::int64_t g = lo + done;
    const std::int64_t b = std::min<std::int64_t>(g / span, n - 1);
    const std::int64_t end = b == n - 1 ? lo + count : std::min(lo + count, (b + 1) * span);
    RankRun r{g, end - g, {}};
    for (std::int64_t j = 0; j < n; ++j) r.order.push_back(static_cast<int>(((b - 1 - j) % n + n) % n));
    out.push_back(std::move(r));
    done = end - lo;
  }
  return out;
}

void reduce_members(const ReduceSpec& spec, const std::vector<const void*>& ins, const std::vector<void*>& outs,
                    std::int64_t global_lo, std::int64_t count) {
  if (count <= 0 || ins.empty()) return;
  auto run = [&](const std::vector<const void*>& in, const std::vector<void*>& out, std::int64_t off,
                 std::int64_t cnt) {
    dispatch_reduce(spec.op, spec.dtype, [&]<class T, ReduceOp Op>() {
      reduce_typed<T, Op>(in, out, off, cnt, spec.pre_divisor);
    });
  };
  const std::int64_t n = static_cast<std::int64_t>(ins.size());
  const bool ring = spec.order == ReduceOrder::ring && n >= 3 &&  // two ranks: a + b == b + a
                    (spec.dtype == DType::float32 || spec.dtype == DType::float64);
  if (!ring) {
    run(ins, outs, 0, count);
    return;
  }
  // gloo's ring (torch 1.13's CPU all_reduce), measured against it: the
  // buffer of T bytes is cut into segments of at most 1 MiB, at least 2n of
  // them and a multiple of n (numSegments), each of ceil(T / numSegments)
  // bytes rounded up to whole elements; rank b finishes the b-th run of
  // numSegments / n segments, whose sum starts at rank b - 1 and goes down the
  // ring to rank b (each rank adds its own values to what it received).
  const std::int64_t es = static_cast<std::int64_t>(itemsize(spec.dtype));
  const std::int64_t T = spec.total * es;
  auto round_up = [](std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; };
  const std::int64_t max_seg = es * ((std::int64_t{1} << 20) / es);
  const std::int64_t seg0 = round_up(std::min((T + 2 * n - 1) / (2 * n), max_seg), es);
  const std::int64_t nseg = round_up(std::max((T + seg0 - 1) / seg0, 2 * n), n);
  const std::int64_t seg = round_up((T + nseg - 1) / nseg, es);
  const std::int64_t span = std::max<std::int64_t>(1, (nseg / n) * seg / es);  // elements rank b finishes
  std::vector<const void*> rot(ins.size());
  std::int64_t done = 0;
  while (done < count) {
    const std::int64_t g = global_lo + done;
    const std::int64_t b = std::min<std::int64_t>(g / span, n - 1);
    const std::int64_t end = b == n - 1 ? global_lo + count : std::min(global_lo + count, (b + 1) * span);
    const std::int64_t cnt = end - g;
    for (std::int64_t j = 0; j < n; ++j)
      rot[static_cast<std::size_t>(j)] = ins[static_cast<std::size_t>(((b - 1 - j) % n + n) % n)];
    run(rot, outs, done, cnt);
    done += cnt;
  }
}

void reduce_range(ReduceOp op, DType dtype, const std::vector<const void*>& ins,
                  const std::vector<void*>& outs, std::int64_t lo, std::int64_t count) {
  if (count <= 0 || ins.empty()) return;
  dispatch_reduce(op, dtype, [&]<class T, ReduceOp Op>() { reduce_typed<T, Op>(ins, outs, lo, count); });
}

}  // namespace dopt::detail
