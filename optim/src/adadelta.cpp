#include "dopt/optim/adadelta.hpp"

#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct AdadeltaScalars {
  T gsign, wd, rho, one_minus_rho, eps, neg_lr;
};

// No control flow in the loop (vectorises); maximize is an exact * -1.
template <class T, bool Wd>
DOPT_INLINE void adadelta_body(T* __restrict p, const T* __restrict g, T* __restrict sq, T* __restrict acc, i64 n,
                               const AdadeltaScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, sq, acc) {
    const T pi = p[i];
    T gi = g[i] * s.gsign;
    if constexpr (Wd) gi = std::fma(s.wd, pi, gi);
    T sqi = sq[i] * s.rho;
    sqi = std::fma(s.one_minus_rho * gi, gi, sqi);
    const T stdv = std::sqrt(sqi + s.eps);
    T ai = acc[i];
    const T delta = (std::sqrt(ai + s.eps) / stdv) * gi;
    ai = ai * s.rho;
    ai = std::fma(s.one_minus_rho * delta, delta, ai);
    p[i] = std::fma(s.neg_lr, delta, pi);
    sq[i] = sqi;
    acc[i] = ai;
  }
}

#define DOPT_ADADELTA_PARAMS(T) T* p, const T* g, T* sq, T* acc, i64 n, const AdadeltaScalars<T>& s
DOPT_KERNEL_ENTRY_FLAG(adadelta_kernel, adadelta_body, DOPT_ADADELTA_PARAMS, (p, g, sq, acc, n, s))
#undef DOPT_ADADELTA_PARAMS

}  // namespace
}  // namespace kernels

void Adadelta::init_param_state(const AdadeltaOptions& /*o*/, const Tensor& p, ParamState& st) {
  detail::init_step_and_zeros(st, p, DType::int64, {"square_avg", "acc_delta"});
}

void Adadelta::update_param(const AdadeltaOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  const char* op = "Adadelta.step";
  Tensor& step_t = detail::state_at(st, "step", op);
  Tensor& sq = detail::matching_state_at(st, "square_avg", p, op);
  Tensor& acc = detail::matching_state_at(st, "acc_delta", p, op);
  detail::increment_step(step_t);
  kernels::dispatch_float(p, op, [&](auto tag) {
    using T = decltype(tag);
    using kernels::sc;
    kernels::AdadeltaScalars<T> k{o.maximize() ? T(-1) : T(1), sc<T>(o.weight_decay()), sc<T>(o.rho()),
                                  sc<T>(1.0 - o.rho()),         sc<T>(o.eps()),           sc<T>(-o.lr())};
    kernels::adadelta_kernel(p.data<T>(), g.data<T>(), sq.template data<T>(), acc.template data<T>(), p.numel(), k,
                             o.weight_decay() != 0.0);
  });
}

}  // namespace dopt::optim
