#pragma once
// Internal: the per-parameter step every elementwise optimizer (Adam,
// Adadelta, ..., Muon's momentum aside) runs in update_param: its state
// layout, the state's creation and lookup, the step counter, and the one
// fused kernel call over the parameter, its gradient and its state tensors.
//
// Order of a step (a bad state or parameter changes nothing): the counter
// and the buffers are looked up (StateError), a CPU kernel is checked to
// take the parameter (NotSupportedError, DTypeError), the counter is
// incremented, the kernel runs.
#include <array>
#include <cmath>
#include <cstddef>
#include <tuple>

#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim::detail {

/// One parameter's step in progress (StateLayout::begin).
template <std::size_t N>
struct ParamStep {
  const char* op;
  const Tensor& p;
  const Tensor& g;
  /// The step counter's new value.
  double step;
  /// The layout's buffers, in its order; null: not used by this step.
  std::array<Tensor*, N> buffers;

  /// torch's bias correction 1 - beta^step of a moment with decay beta.
  double bias_correction(double beta) const { return 1.0 - std::pow(beta, step); }

  /// kernel(p, g, buffers..., numel, Scalars<T>(args...)) for the element
  /// type T of p (float or double); an unused buffer is passed as null.
  template <template <class> class Scalars, class Kernel, class... Args>
  void run(const Kernel& kernel, const Args&... args) const {
    kernels::dispatch_float(p, op, [&](auto tag) {
      using T = decltype(tag);
      std::apply(
          [&](auto*... b) {
            kernel(p.data<T>(), g.data<T>(), (b ? b->template data<T>() : nullptr)..., p.numel(),
                   Scalars<T>(args...));
          },
          buffers);
    });
  }
};

/// The state of an elementwise optimizer, as torch keeps it: a 0-d `step`
/// counter of step_dtype, and under `buffers` tensors shaped like the
/// parameter. A `used` mask says which buffers a parameter has (an option
/// such as amsgrad decides); by default all.
template <std::size_t N>
struct StateLayout {
  DType step_dtype;
  std::array<const char*, N> buffers;

  static constexpr std::array<bool, N> all() {
    std::array<bool, N> a{};
    a.fill(true);
    return a;
  }

  /// p's new state: the counter at 0 and zeros under the used buffers.
  void init(const Tensor& p, ParamState& st, const std::array<bool, N>& used = all()) const {
    st["step"] = Tensor::scalar(0.0, step_dtype);
    for (std::size_t i = 0; i < N; ++i)
      if (used[i]) st[buffers[i]] = Tensor::zeros(p.shape(), p.dtype(), p.device());
  }

  /// Starts the step of p with gradient g (the order above); errors name op.
  ParamStep<N> begin(const char* op, const Tensor& p, const Tensor& g, ParamState& st,
                     const std::array<bool, N>& used = all()) const {
    Tensor& step_t = state_at(st, "step", op);
    std::array<Tensor*, N> found{};
    for (std::size_t i = 0; i < N; ++i)
      if (used[i]) found[i] = &matching_state_at(st, buffers[i], p, op);
    kernels::dispatch_float(p, op, [](auto) {});  // the dtype and device errors
    return {op, p, g, increment_step(step_t), found};
  }
};

}  // namespace dopt::optim::detail
