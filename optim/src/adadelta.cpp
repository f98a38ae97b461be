#include "dopt/optim/adadelta.hpp"

#include "param_step.hpp"

namespace dopt::optim {

namespace kernels {
namespace {

template <class T>
struct AdadeltaScalars {
  T gsign, wd, rho, one_minus_rho, eps, neg_lr;
  bool has_wd;
  explicit AdadeltaScalars(const AdadeltaOptions& o)
      : gsign(o.maximize() ? T(-1) : T(1)), wd(sc<T>(o.weight_decay())), rho(sc<T>(o.rho())),
        one_minus_rho(sc<T>(1.0 - o.rho())), eps(sc<T>(o.eps())), neg_lr(sc<T>(-o.lr())),
        has_wd(o.weight_decay() != 0.0) {}
};

// No control flow in the loop (vectorises); maximize is an exact * -1.
template <class T, bool Wd>
DOPT_INLINE void adadelta_body(T* __restrict p, const T* __restrict g, T* __restrict sq, T* __restrict acc, i64 n,
                               const AdadeltaScalars<T>& s) {
  DOPT_FOR_EACH_ELEMENT(T, n, i, p, g, sq, acc) {
    const T pi = p[i];
    const T gi = kernels::decayed_grad<Wd>(g[i], pi, s);
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

DOPT_KERNEL_ENTRY_FLAG(adadelta_kernel, adadelta_body, s.has_wd, (p, g, sq, acc, n, s), T* p, const T* g, T* sq, T* acc,
                       i64 n, const AdadeltaScalars<T>& s)

}  // namespace
}  // namespace kernels

// `step` counts as torch's Python int; the math does not use it.
constexpr detail::StateLayout<2> kAdadeltaState{DType::int64, {"square_avg", "acc_delta"}};

void Adadelta::update_param(const AdadeltaOptions& o, const Tensor& p, const Tensor& g, ParamState& st) {
  kAdadeltaState.begin("Adadelta.step", p, g, st).run<kernels::AdadeltaScalars>(kernels::adadelta_kernel, o);
}

void Adadelta::init_param_state(const AdadeltaOptions& /*o*/, const Tensor& p, ParamState& st) {
  kAdadeltaState.init(p, st);
}

}  // namespace dopt::optim
