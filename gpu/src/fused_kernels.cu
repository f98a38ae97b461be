// Fused multi-tensor optimizer kernels (one pass over memory per step).
//
// Exactness: each element's update is the CPU path's (optim/src/<opt>.cpp)
// operation for operation, in the same order: explicit correctly rounded FMA
// (__fmaf_rn / __fma_rn) exactly where the CPU path calls std::fma, IEEE
// division and square root (__fdiv_rn, __fsqrt_rn, ...), every other product
// and sum a plain rounded operation (this file is compiled with --fmad=false,
// so nvcc never contracts one into an FMA), the NaN-propagating selects
// written as on the CPU. Scalars arrive as doubles computed as on the CPU and
// are rounded to the compute type once. So float32/float64 results are
// bitwise those of the CPU path.
//
// 16-bit parameters (float16, bfloat16) are computed in float32: the
// parameter (or its fp32 master copy, when there is one) and the state are
// widened, updated in float32 and rounded to their storage type once
// (round to nearest even).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "multi_tensor.hpp"

namespace dopt::gpu::detail {
namespace {

// dopt::DType codes (runtime/dopt/runtime/dtype.hpp).
constexpr int kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3;

template <class T> struct compute_of { using type = float; };
template <> struct compute_of<double> { using type = double; };

__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }
__device__ __forceinline__ float abs_(float a) { return fabsf(a); }
__device__ __forceinline__ double abs_(double a) { return fabs(a); }

template <class C> __device__ __forceinline__ C load(const float* p, long long i) { return p[i]; }
template <class C> __device__ __forceinline__ C load(const double* p, long long i) { return p[i]; }
template <class C> __device__ __forceinline__ C load(const __half* p, long long i) { return __half2float(p[i]); }
template <class C> __device__ __forceinline__ C load(const __nv_bfloat16* p, long long i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void store(double* p, long long i, double v) { p[i] = v; }
__device__ __forceinline__ void store(__half* p, long long i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, long long i, float v) { p[i] = __float2bfloat16_rn(v); }

template <class C>
struct Scalars {
  C neg_lr, wd, decay_mul, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, bc2_sqrt, momentum,
      one_minus_dampening, etaplus, etaminus, step_min, step_max, gsign;
  bool has_wd, decoupled, amsgrad, nesterov, centered, has_momentum;
  int mom_mode;
};

template <class C>
Scalars<C> round_scalars(const FusedScalars& s) {
  Scalars<C> k;
  k.neg_lr = static_cast<C>(s.neg_lr);
  k.wd = static_cast<C>(s.wd);
  k.decay_mul = static_cast<C>(s.decay_mul);
  k.beta1 = static_cast<C>(s.beta1);
  k.one_minus_beta1 = static_cast<C>(s.one_minus_beta1);
  k.beta2 = static_cast<C>(s.beta2);
  k.one_minus_beta2 = static_cast<C>(s.one_minus_beta2);
  k.eps = static_cast<C>(s.eps);
  k.bc2_sqrt = static_cast<C>(s.bc2_sqrt);
  k.momentum = static_cast<C>(s.momentum);
  k.one_minus_dampening = static_cast<C>(s.one_minus_dampening);
  k.etaplus = static_cast<C>(s.etaplus);
  k.etaminus = static_cast<C>(s.etaminus);
  k.step_min = static_cast<C>(s.step_min);
  k.step_max = static_cast<C>(s.step_max);
  k.gsign = s.maximize ? C(-1) : C(1);
  k.has_wd = s.has_wd;
  k.decoupled = s.decoupled;
  k.amsgrad = s.amsgrad;
  k.nesterov = s.nesterov;
  k.centered = s.centered;
  k.has_momentum = s.has_momentum;
  k.mom_mode = s.mom_mode;
  return k;
}

// The parameter: read from the fp32 master when there is one, else widened
// from its storage; written to both.
template <class C, class P>
struct ParamRef {
  P* p;
  float* master;
  __device__ __forceinline__ C get(long long i) const { return master ? C(master[i]) : load<C>(p, i); }
  __device__ __forceinline__ void set(long long i, C v) const {
    if (master) master[i] = static_cast<float>(v);
    store(p, i, v);
  }
};

// --- per-element updates (the CPU path's loop bodies) -----------------------------------

template <class C, class P, class S>
__device__ __forceinline__ void sgd_elem(long long i, ParamRef<C, P> p, const P* g, S* buf, const Scalars<C>& s) {
  const C pi = p.get(i);
  C d = load<C>(g, i) * s.gsign;
  if (s.has_wd) d = fma_rn(s.wd, pi, d);
  if (s.mom_mode != 0) {
    C b;
    if (s.mom_mode == 1) {
      b = d;
    } else {
      b = load<C>(buf, i) * s.momentum;
      b = fma_rn(s.one_minus_dampening, d, b);
    }
    store(buf, i, b);
    if (s.nesterov) d = fma_rn(s.momentum, b, d);
    else d = b;
  }
  p.set(i, fma_rn(s.neg_lr, d, pi));
}

template <class C, class P, class S>
__device__ __forceinline__ void adam_elem(long long i, ParamRef<C, P> p, const P* g, S* m, S* v, S* vmax,
                                          const Scalars<C>& s) {
  C pi = p.get(i);
  C gi = load<C>(g, i) * s.gsign;
  if (s.decoupled) pi = pi * s.decay_mul;
  else if (s.has_wd) gi = fma_rn(s.wd, pi, gi);
  C mi = load<C>(m, i) * s.beta1;
  mi = fma_rn(s.one_minus_beta1, gi, mi);
  C vi = load<C>(v, i) * s.beta2;
  vi = fma_rn(s.one_minus_beta2 * gi, gi, vi);
  C base = vi;
  if (s.amsgrad) {
    const C mx = load<C>(vmax, i);
    const C r = (mx != mx || vi != vi) ? mx + vi : (mx > vi ? mx : vi);  // torch.maximum, NaN propagates
    store(vmax, i, r);
    base = r;
  }
  C denom = div_rn(sqrt_rn(base), s.bc2_sqrt);
  denom = denom + s.eps;
  pi = pi + div_rn(s.neg_lr * mi, denom);
  p.set(i, pi);
  store(m, i, mi);
  store(v, i, vi);
}

/// The gradient as an update uses it: its sign flipped for maximize, then
/// plus wd * p (one fma) when the group has weight decay.
template <class C, class P>
__device__ __forceinline__ C decayed_grad(const P* g, long long i, C pi, const Scalars<C>& s) {
  C gi = load<C>(g, i) * s.gsign;
  if (s.has_wd) gi = fma_rn(s.wd, pi, gi);
  return gi;
}

template <class C, class P, class S>
__device__ __forceinline__ void adagrad_elem(long long i, ParamRef<C, P> p, const P* g, S* sum,
                                             const Scalars<C>& s) {
  const C pi = p.get(i);
  const C gi = decayed_grad(g, i, pi, s);
  const C si = fma_rn(gi, gi, load<C>(sum, i));
  const C std_i = sqrt_rn(si) + s.eps;
  p.set(i, pi + div_rn(s.neg_lr * gi, std_i));
  store(sum, i, si);
}

template <class C, class P, class S>
__device__ __forceinline__ void rmsprop_elem(long long i, ParamRef<C, P> p, const P* g, S* sq, S* ga, S* buf,
                                             const Scalars<C>& s) {
  // alpha is carried in beta2 / one_minus_beta2.
  const C pi = p.get(i);
  const C gi = decayed_grad(g, i, pi, s);
  C sqi = load<C>(sq, i) * s.beta2;
  sqi = fma_rn(s.one_minus_beta2 * gi, gi, sqi);
  store(sq, i, sqi);
  C avg;
  if (s.centered) {
    C gai = load<C>(ga, i) * s.beta2;
    gai = fma_rn(s.one_minus_beta2, gi, gai);
    store(ga, i, gai);
    avg = sqrt_rn(fma_rn(-gai, gai, sqi));
  } else {
    avg = sqrt_rn(sqi);
  }
  avg = avg + s.eps;
  if (s.has_momentum) {
    C b = load<C>(buf, i) * s.momentum;
    b = b + div_rn(gi, avg);
    store(buf, i, b);
    p.set(i, fma_rn(s.neg_lr, b, pi));
  } else {
    p.set(i, pi + div_rn(s.neg_lr * gi, avg));
  }
}

template <class C, class P, class S>
__device__ __forceinline__ void adamax_elem(long long i, ParamRef<C, P> p, const P* g, S* m, S* u,
                                            const Scalars<C>& s) {
  const C pi = p.get(i);
  const C gi = decayed_grad(g, i, pi, s);
  C mi = load<C>(m, i) * s.beta1;
  mi = fma_rn(s.one_minus_beta1, gi, mi);
  const C a = load<C>(u, i) * s.beta2;
  const C b = abs_(gi) + s.eps;
  const C ui = (a > b || a != a) ? a : b;  // torch.amax, NaN propagates
  p.set(i, pi + div_rn(s.neg_lr * mi, ui));
  store(m, i, mi);
  store(u, i, ui);
}

template <class C, class P, class S>
__device__ __forceinline__ void adadelta_elem(long long i, ParamRef<C, P> p, const P* g, S* sq, S* acc,
                                              const Scalars<C>& s) {
  // rho is carried in beta2 / one_minus_beta2.
  const C pi = p.get(i);
  const C gi = decayed_grad(g, i, pi, s);
  C sqi = load<C>(sq, i) * s.beta2;
  sqi = fma_rn(s.one_minus_beta2 * gi, gi, sqi);
  const C stdv = sqrt_rn(sqi + s.eps);
  C ai = load<C>(acc, i);
  const C delta = div_rn(sqrt_rn(ai + s.eps), stdv) * gi;
  ai = ai * s.beta2;
  ai = fma_rn(s.one_minus_beta2 * delta, delta, ai);
  p.set(i, fma_rn(s.neg_lr, delta, pi));
  store(sq, i, sqi);
  store(acc, i, ai);
}

template <class C, class P, class S>
__device__ __forceinline__ void rprop_elem(long long i, ParamRef<C, P> p, const P* g, S* prev, S* ss,
                                           const Scalars<C>& s) {
  const C gi = load<C>(g, i) * s.gsign;
  const C prod = gi * load<C>(prev, i);  // NaN compares false both ways: factor 1
  C f = prod > C(0) ? s.etaplus : C(1);
  f = prod < C(0) ? s.etaminus : f;
  C si = load<C>(ss, i) * f;
  si = si < s.step_min ? s.step_min : si;
  si = si > s.step_max ? s.step_max : si;
  const C ge = f == s.etaminus ? C(0) : gi;
  C sgn = ge > C(0) ? C(1) : C(0);
  sgn = ge < C(0) ? C(-1) : sgn;
  p.set(i, fma_rn(C(-1) * sgn, si, p.get(i)));
  store(ss, i, si);
  store(prev, i, ge);
}

// --- the multi-tensor kernel ---------------------------------------------------------------

template <FusedOp Op, class P, class S>
__global__ void __launch_bounds__(kThreads) fused_kernel(TensorListMeta meta, Scalars<typename compute_of<P>::type> s) {
  using C = typename compute_of<P>::type;
  const int t = meta.block_tensor[blockIdx.x];
  const long long n = meta.numel[t];
  const long long begin = static_cast<long long>(meta.block_chunk[blockIdx.x]) * kChunk;
  const long long end = begin + kChunk < n ? begin + kChunk : n;
  ParamRef<C, P> p{static_cast<P*>(meta.ptr[0][t]), static_cast<float*>(meta.ptr[5][t])};
  const P* g = static_cast<const P*>(meta.ptr[1][t]);
  S* s2 = static_cast<S*>(meta.ptr[2][t]);
  S* s3 = static_cast<S*>(meta.ptr[3][t]);
  S* s4 = static_cast<S*>(meta.ptr[4][t]);
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    if constexpr (Op == FusedOp::sgd) sgd_elem<C, P, S>(i, p, g, s2, s);
    else if constexpr (Op == FusedOp::adam) adam_elem<C, P, S>(i, p, g, s2, s3, s4, s);
    else if constexpr (Op == FusedOp::adagrad) adagrad_elem<C, P, S>(i, p, g, s2, s);
    else if constexpr (Op == FusedOp::rmsprop) rmsprop_elem<C, P, S>(i, p, g, s2, s3, s4, s);
    else if constexpr (Op == FusedOp::adamax) adamax_elem<C, P, S>(i, p, g, s2, s3, s);
    else if constexpr (Op == FusedOp::adadelta) adadelta_elem<C, P, S>(i, p, g, s2, s3, s);
    else rprop_elem<C, P, S>(i, p, g, s2, s3, s);
  }
}

template <FusedOp Op, class P, class S>
void launch_typed(const TensorListMeta& meta, int nblocks, const FusedScalars& s, cudaStream_t stream) {
  using C = typename compute_of<P>::type;
  fused_kernel<Op, P, S><<<nblocks, kThreads, 0, stream>>>(meta, round_scalars<C>(s));
}

template <FusedOp Op>
void launch_op(int pdt, int sdt, const TensorListMeta& meta, int nblocks, const FusedScalars& s,
               cudaStream_t stream) {
  if (pdt == kF32 && sdt == kF32) return launch_typed<Op, float, float>(meta, nblocks, s, stream);
  if (pdt == kF64 && sdt == kF64) return launch_typed<Op, double, double>(meta, nblocks, s, stream);
  if (pdt == kF16 && sdt == kF16) return launch_typed<Op, __half, __half>(meta, nblocks, s, stream);
  if (pdt == kF16 && sdt == kF32) return launch_typed<Op, __half, float>(meta, nblocks, s, stream);
  if (pdt == kBF16 && sdt == kBF16) return launch_typed<Op, __nv_bfloat16, __nv_bfloat16>(meta, nblocks, s, stream);
  if (pdt == kBF16 && sdt == kF32) return launch_typed<Op, __nv_bfloat16, float>(meta, nblocks, s, stream);
  throw std::invalid_argument("launch_fused: unsupported (param, state) dtype pair (" + std::to_string(pdt) + ", " +
                              std::to_string(sdt) + ")");
}

}  // namespace

void launch_fused(FusedOp op, int pdt, int sdt, const TensorListMeta& meta, int nblocks, const FusedScalars& s,
                  void* stream_ptr) {
  if (nblocks <= 0) return;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (op) {
    case FusedOp::sgd: launch_op<FusedOp::sgd>(pdt, sdt, meta, nblocks, s, stream); break;
    case FusedOp::adam: launch_op<FusedOp::adam>(pdt, sdt, meta, nblocks, s, stream); break;
    case FusedOp::adagrad: launch_op<FusedOp::adagrad>(pdt, sdt, meta, nblocks, s, stream); break;
    case FusedOp::rmsprop: launch_op<FusedOp::rmsprop>(pdt, sdt, meta, nblocks, s, stream); break;
    case FusedOp::adamax: launch_op<FusedOp::adamax>(pdt, sdt, meta, nblocks, s, stream); break;
    case FusedOp::adadelta: launch_op<FusedOp::adadelta>(pdt, sdt, meta, nblocks, s, stream); break;
    case FusedOp::rprop: launch_op<FusedOp::rprop>(pdt, sdt, meta, nblocks, s, stream); break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("fused optimizer kernel launch failed: ") + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
}

}  // namespace dopt::gpu::detail
