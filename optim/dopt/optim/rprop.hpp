#pragma once
// torch.optim.Rprop (1.13), float32/float64 results bit-identical to torch's
// single-tensor path.
//
// State (lazy, at a parameter's first step with a gradient): `step` (int64 0-d
// tensor, torch's Python int; unused by the math), `prev` (the previous
// effective gradient, zeros at first) and `step_size` (full of the lr of the
// group when the state is created).
//
// Per element: the sign of the float32 product g * prev picks the factor
// (eta+ if > 0, eta- if < 0, 1 otherwise; an underflow to 0 or a NaN counts as
// 0), step_size = clamp(step_size * factor, step_sizes), the gradient is
// zeroed where the factor is eta-, and p -= sign(g) * step_size (sign(NaN) is
// 0: a NaN gradient gives no update but is stored in `prev`). No weight decay.
#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class RpropOptions : public OptionsCRTP<RpropOptions> {
  DOPT_OPTIONS_WITH_LR(RpropOptions, 1e-2);
  DOPT_ARG(RpropOptions, Pair, etas, (Pair{0.5, 1.2}), checks::Etas{});
  /// Not checked (as torch).
  DOPT_ARG(RpropOptions, Pair, step_sizes, (Pair{1e-6, 50.0}));
  DOPT_ARG_MAXIMIZE(RpropOptions);
};

class Rprop : public BasicOptimizer<Rprop, RpropOptions> {
  DOPT_OPTIMIZER(Rprop, RpropOptions);
};

}  // namespace dopt::optim
