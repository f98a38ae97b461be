#pragma once
// Muon (torch 2.9's torch.optim.Muon): SGD momentum whose update direction is
// orthogonalised by a Newton-Schulz iteration, for 2-D parameters only
// (docs/optimizers.md has the formulas; docs/zero.md how it shards).
//
// Per parameter p of shape [A, B] with gradient g, in group order:
//   buf = lerp(buf, g, 1 - momentum)                 (moving average)
//   u   = nesterov ? lerp(g, buf, momentum) : buf
//   O   = NewtonSchulz(u)   (ns_steps iterations with ns_coefficients,
//                            after normalising by max(||u||_F, eps))
//   p   = p * (1 - lr * weight_decay) - adjusted_lr * O
// with adjusted_lr = lr * sqrt(max(1, A / B)) ("original", the default) or
// lr * 0.2 * sqrt(max(A, B)) ("match_rms_adamw").
//
// Parameters that are not matrices (biases, norms, embeddings if wanted) go
// to another optimizer (AdamW, as usual), set up by the user: Muon refuses
// any parameter that is not 2-D with a dopt::ValueError, at construction
// and in add_param_group.
//
// State (lazy, at a parameter's first step with a gradient):
// `momentum_buffer`, shaped like the parameter; no `step`.
//
// ns_dtype (a dopt option; torch always uses bfloat16) is the precision of
// the Newton-Schulz iteration: "float64" (the default; the reference the
// conformance traces use), "float32", or "bfloat16" (torch's: every matrix
// product's operands and results rounded to bfloat16, products accumulated in
// float32). The result is rounded to the parameter's dtype before the update.
// Against float64, the largest elementwise difference of O, relative to
// max|O|, stays below 1e-5 with float32 and below 0.06 with bfloat16.
//
// The iteration runs on the calling thread (no thread pool). Built with
// DOPT_MUON_AVX2 (the default on x86-64) it needs AVX2 and FMA: on a CPU
// without them step() throws NotSupportedError before changing anything.
//
// Exactly one Newton-Schulz iteration runs per parameter with a gradient per
// step() (muon_orthogonalizations() counts them, process-wide).
//
// CPU only: parameters on another device are refused with NotSupportedError
// naming Muon. float32 and float64 parameters.
#include <array>
#include <cstdint>
#include <string>

#include "dopt/optim/basic_optimizer.hpp"
#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

class MuonOptions : public OptionsCRTP<MuonOptions> {
  DOPT_OPTIONS(MuonOptions);
  /// The fields' rules, then: adjust_lr_fn "original" or "match_rms_adamw"
  /// (torch's), ns_steps in 0..100, finite ns_coefficients and a known
  /// ns_dtype (dopt's).
  void validate(const std::string& op) const override;
  /// Muon takes 2-D parameters only.
  void check_param(const Tensor& param, const std::string& op) const override;
  /// Multiply-adds of one step: ns_steps * (2 m^2 n + m^3) with m = min(A, B),
  /// n = max(A, B), plus the elementwise work (a few per element).
  double step_cost(const Shape& shape) const override;

  DOPT_ARG(MuonOptions, double, lr, 1e-3, checks::AtLeastZero{"Learning rate"});
  DOPT_ARG(MuonOptions, double, weight_decay, 0.1, checks::AtLeastZero{"weight decay"});
  DOPT_ARG(MuonOptions, double, momentum, 0.95, checks::AtLeastZero{"momentum"});
  DOPT_ARG(MuonOptions, bool, nesterov, true);
  DOPT_ARG(MuonOptions, Triple, ns_coefficients, (Triple{3.4445, -4.775, 2.0315}));
  DOPT_ARG(MuonOptions, double, eps, 1e-7, checks::AtLeastZero{"eps"});
  DOPT_ARG(MuonOptions, std::int64_t, ns_steps, 5);
  /// "original" (torch's default, also its None) or "match_rms_adamw".
  DOPT_ARG(MuonOptions, std::string, adjust_lr_fn, "original");
  /// "float64", "float32" or "bfloat16" (see the header comment).
  DOPT_ARG(MuonOptions, std::string, ns_dtype, "float64");
};

/// update_param refuses a parameter off the CPU with dopt::NotSupportedError
/// and one that is not 2-D with dopt::ValueError.
class Muon : public BasicOptimizer<Muon, MuonOptions> {
  DOPT_OPTIMIZER(Muon, MuonOptions);
  static constexpr bool kDeviceKernels = false;

  /// The learning-rate ratio of adjust_lr_fn for a [A, B] matrix.
  static double lr_ratio(const std::string& adjust_lr_fn, std::int64_t rows, std::int64_t cols);
};

/// The Newton-Schulz iteration of Muon on its own: O = NS(u) for a 2-D
/// float32/float64 CPU tensor u (u is not changed), in the precision
/// `ns_dtype`; returns a new tensor of u's dtype and shape. Throws ValueError
/// for a tensor that is not 2-D or an unknown ns_dtype.
Tensor muon_newton_schulz(const Tensor& u, const std::array<double, 3>& coefficients, std::int64_t steps,
                          double eps, const std::string& ns_dtype = "float64");

/// Newton-Schulz iterations run so far in this process (by every Muon,
/// FunctionalMuon and muon_newton_schulz call on any thread); for tests and
/// diagnostics.
std::int64_t muon_orthogonalizations() noexcept;

}  // namespace dopt::optim
