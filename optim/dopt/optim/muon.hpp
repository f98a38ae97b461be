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

#include "dopt/optim/options_base.hpp"

namespace dopt::optim {

using Triple = std::array<double, 3>;

class MuonOptions : public OptionsCRTP<MuonOptions> {
 public:
  explicit MuonOptions(double lr = 1e-3) : lr_(lr) {}
  Hyperparams to_hyperparams() const override;
  void set_hyperparams(const Hyperparams& h) override;
  /// torch's checks: lr >= 0, momentum >= 0, weight_decay >= 0, adjust_lr_fn
  /// "original" or "match_rms_adamw"; and (dopt) eps >= 0, ns_steps a whole
  /// number in 0..100, ns_dtype "float64", "float32" or "bfloat16".
  void validate(const std::string& op) const override;
  /// Muon takes 2-D parameters only.
  void check_param(const Tensor& param, const std::string& op) const override;
  /// Multiply-adds of one step: ns_steps * (2 m^2 n + m^3) with m = min(A, B),
  /// n = max(A, B), plus the elementwise work (a few per element).
  double step_cost(const Shape& shape) const override;

  DOPT_ARG(MuonOptions, double, lr, 1e-3);
  DOPT_ARG(MuonOptions, double, weight_decay, 0.1);
  DOPT_ARG(MuonOptions, double, momentum, 0.95);
  DOPT_ARG(MuonOptions, bool, nesterov, true);
  DOPT_ARG(MuonOptions, Triple, ns_coefficients, (Triple{3.4445, -4.775, 2.0315}));
  DOPT_ARG(MuonOptions, double, eps, 1e-7);
  DOPT_ARG(MuonOptions, std::int64_t, ns_steps, 5);
  /// "original" (torch's default, also its None) or "match_rms_adamw".
  DOPT_ARG(MuonOptions, std::string, adjust_lr_fn, "original");
  /// "float64", "float32" or "bfloat16" (see the header comment).
  DOPT_ARG(MuonOptions, std::string, ns_dtype, "float64");
};

class Muon : public Optimizer {
 public:
  using Options = MuonOptions;
  explicit Muon(std::vector<OptimizerParamGroup> groups, MuonOptions defaults = MuonOptions());
  /// One group of `params`; an empty list throws dopt::ValueError (as torch).
  explicit Muon(std::vector<Tensor> params, MuonOptions defaults = MuonOptions());

  /// One parameter's lazy state and update (shared with FunctionalMuon).
  /// update_param expects a grad that matches p; a state lacking
  /// `momentum_buffer`, or one that does not match p, is a dopt::StateError
  /// (nothing changes); a parameter off the CPU is a dopt::NotSupportedError.
  static void init_param_state(const MuonOptions& o, const Tensor& p, ParamState& st);
  static void update_param(const MuonOptions& o, const Tensor& p, const Tensor& g, ParamState& st);
  /// Muon has no device kernels here (see the header).
  static constexpr bool kDeviceKernels = false;

  /// The learning-rate ratio of adjust_lr_fn for a [A, B] matrix.
  static double lr_ratio(const std::string& adjust_lr_fn, std::int64_t rows, std::int64_t cols);

 protected:
  void init_state(const OptimizerOptions& o, const Tensor& p, ParamState& st) const override;
  void update(const OptimizerOptions& o, const Tensor& p, const Tensor& g, ParamState& st) const override;
  bool has_device_kernels() const noexcept override { return false; }
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
