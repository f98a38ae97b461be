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

  /// One element (two_buffer_loop): sq the square average, acc the
  /// accumulated delta; maximize is an exact * -1.
  DOPT_INLINE void element(T& p, T g, T& sq, T& acc) const {
    sq = std::fma(one_minus_rho * g, g, sq * rho);
    const T stdv = std::sqrt(sq + eps);
    const T delta = (std::sqrt(acc + eps) / stdv) * g;
    acc = std::fma(one_minus_rho * delta, delta, acc * rho);
    p = std::fma(neg_lr, delta, p);
  }
};

DOPT_TWO_BUFFER_KERNEL(adadelta_kernel, AdadeltaScalars)

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
