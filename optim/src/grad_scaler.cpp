// Loss scaling and the agreement on skipped steps (grad_scaler.hpp).
#include "dopt/optim/grad_scaler.hpp"

#include <cmath>
#include <string>

#include "kernel_support.hpp"
#include "optim_extra.hpp"

namespace dopt::optim {
namespace kernels {
namespace {

// x *= inv for every element; returns whether some element was inf/NaN
// ((x - x) is NaN exactly for inf and NaN). No control flow: vectorises.
template <class T>
DOPT_INLINE bool unscale_body(T* __restrict x, i64 n, T inv) {
  int bad = 0;
  for (i64 i = 0; i < n; ++i) {
    const T v = x[i];
    const T z = v - v;
    bad |= (z != z);
    x[i] = v * inv;
  }
  return bad != 0;
}
DOPT_KERNEL bool unscale_f32(float* x, i64 n, float inv) { return unscale_body(x, n, inv); }
DOPT_KERNEL bool unscale_f64(double* x, i64 n, double inv) { return unscale_body(x, n, inv); }

template <class T>
DOPT_INLINE bool nonfinite_body(const T* __restrict x, i64 n) {
  int bad = 0;
  for (i64 i = 0; i < n; ++i) {
    const T z = x[i] - x[i];
    bad |= (z != z);
  }
  return bad != 0;
}
DOPT_KERNEL bool nonfinite_f32(const float* x, i64 n) { return nonfinite_body(x, n); }
DOPT_KERNEL bool nonfinite_f64(const double* x, i64 n) { return nonfinite_body(x, n); }

}  // namespace
}  // namespace kernels

namespace {

void check_float_cpu(const Tensor& t, const char* op) {
  if (!t.device().is_cpu())
    throw NotSupportedError(op, "gradients on " + t.device().str() + " are not supported (CPU only)");
  if (!is_floating_point(t.dtype()))
    throw DTypeError(op, "gradients must be floating point, got " + std::string(dtype_name(t.dtype())));
}

/// Unscales one gradient by inv (a float32 value); whether it held inf/NaN.
bool unscale_one(const Tensor& g, float inv) {
  const kernels::i64 n = g.numel();
  switch (g.dtype()) {
    case DType::float32: return kernels::unscale_f32(g.data<float>(), n, inv);
    case DType::float64: return kernels::unscale_f64(g.data<double>(), n, static_cast<double>(inv));
    case DType::float16:
    case DType::bfloat16: {
      bool bad = false;
      dispatch_dtype(g.dtype(), [&](auto tag) {
        using H = decltype(tag);
        if constexpr (std::is_same_v<H, Half> || std::is_same_v<H, BFloat16>) {
          H* x = g.data<H>();
          for (kernels::i64 i = 0; i < n; ++i) {
            const float v = static_cast<float>(x[i]);
            bad = bad || !std::isfinite(v);
            x[i] = H(v * inv);
          }
        }
      });
      return bad;
    }
    default: return false;
  }
}

}  // namespace

bool has_nonfinite(const std::vector<Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    check_float_cpu(t, "has_nonfinite");
    const kernels::i64 n = t.numel();
    bool bad = false;
    switch (t.dtype()) {
      case DType::float32: bad = kernels::nonfinite_f32(t.data<float>(), n); break;
      case DType::float64: bad = kernels::nonfinite_f64(t.data<double>(), n); break;
      default:
        for (kernels::i64 i = 0; i < n && !bad; ++i) bad = !std::isfinite(t.at(i));
    }
    if (bad) return true;
  }
  return false;
}

bool any_rank(bool local, ProcessGroup group) {
  if (!group.valid() || !group.is_member()) return local;
  Tensor flag = Tensor::full({1}, local ? 1.0 : 0.0, DType::float32);
  group.all_reduce(flag, ReduceOp::max);
  return flag.data<float>()[0] != 0.0f;
}

GradScaler::GradScaler(GradScalerOptions options) : o_(std::move(options)) {
  const char* op = "GradScaler";
  using detail::py_float;
  if (!(o_.init_scale > 0) || !std::isfinite(o_.init_scale))
    throw ValueError(op, "init_scale must be a positive finite number, got " + py_float(o_.init_scale));
  if (!(o_.growth_factor > 1.0)) throw ValueError(op, "The growth factor must be > 1.0.");
  if (!(o_.backoff_factor < 1.0 && o_.backoff_factor > 0.0)) throw ValueError(op, "The backoff factor must be < 1.0 and > 0.");
  if (o_.growth_interval < 1) throw ValueError(op, "growth_interval must be >= 1, got " + std::to_string(o_.growth_interval));
  scale_ = static_cast<float>(o_.init_scale);
}

double GradScaler::scale(double loss) const { return o_.enabled ? loss * static_cast<double>(scale_) : loss; }

double GradScaler::get_scale() const { return o_.enabled ? static_cast<double>(scale_) : 1.0; }

GradScaler::PerOptimizer& GradScaler::state_for(const void* key, const char* /*op*/) { return per_optimizer_[key]; }

void GradScaler::unscale_grads(const void* key, const std::vector<OptimizerParamGroup>& groups,
                               const ProcessGroup& group, const char* op) {
  std::vector<Tensor> grads;
  for (const auto& g : groups)
    for (const auto& p : g.params) {
      Tensor grad = p.grad();
      if (grad.defined()) grads.push_back(std::move(grad));
    }
  unscale_grads(key, grads, group, op);
}

void GradScaler::unscale_grads(const void* key, const std::vector<Tensor>& grads, const ProcessGroup& group,
                               const char* op) {
  PerOptimizer& st = state_for(key, op);
  if (st.stage == Stage::unscaled)
    throw StateError(op, "unscale_() has already been called on this optimizer since the last update().");
  if (st.stage == Stage::stepped) throw StateError(op, "unscale_() is being called after step().");
  for (const auto& g : grads) check_float_cpu(g, op);
  // torch: inv_scale = scale.double().reciprocal().float()
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale_));
  bool found = false;
  for (const auto& g : grads) found = unscale_one(g, inv) || found;
  st.found_inf = any_rank(found, group);
  st.stage = Stage::unscaled;
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!o_.enabled) return;
  unscale_grads(&optimizer, optimizer.param_groups(), o_.process_group, "GradScaler.unscale_");
}

template <class Step, class Skip>
bool GradScaler::step_impl(const void* key, const char* op, Step&& do_step, Skip&& do_skip,
                           const std::function<void()>& unscale) {
  if (!o_.enabled) {
    do_step();
    return true;
  }
  if (per_optimizer_[key].stage == Stage::stepped)
    throw StateError(op, "step() has already been called since the last update().");
  if (per_optimizer_[key].stage == Stage::ready) unscale();
  PerOptimizer& st = per_optimizer_[key];
  const bool skip = st.found_inf;
  st.stage = Stage::stepped;
  found_inf_any_ = found_inf_any_ || skip;
  if (skip) do_skip();
  else do_step();
  return !skip;
}

bool GradScaler::step(Optimizer& optimizer) {
  return step_impl(
      &optimizer, "GradScaler.step", [&] { optimizer.step(); }, [] {}, [&] { unscale_(optimizer); });
}

bool GradScaler::step_with(const void* key, const char* op, const std::function<void()>& do_step,
                           const std::function<void()>& do_skip, const std::function<void()>& unscale) {
  return step_impl(key, op, do_step, do_skip, unscale);
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!o_.enabled) return;
  const char* op = "GradScaler.update";
  if (new_scale) {
    if (!(*new_scale > 0) || !std::isfinite(*new_scale))
      throw ValueError(op, "new_scale must be a positive finite number, got " + detail::py_float(*new_scale));
    scale_ = static_cast<float>(*new_scale);
  } else {
    bool any = false, found = false;
    for (const auto& [k, st] : per_optimizer_)
      if (st.stage != Stage::ready) {
        any = true;
        found = found || st.found_inf;
      }
    if (!any) throw StateError(op, "No inf checks were recorded prior to update.");
    // torch's _amp_update_scale_: float32 scale times a double factor, rounded to float32.
    if (found) {
      scale_ = static_cast<float>(static_cast<double>(scale_) * o_.backoff_factor);
      growth_tracker_ = 0;
    } else {
      const std::int64_t successful = growth_tracker_ + 1;
      if (successful == o_.growth_interval) {
        const float grown = static_cast<float>(static_cast<double>(scale_) * o_.growth_factor);
        if (std::isfinite(grown)) scale_ = grown;
        growth_tracker_ = 0;
      } else {
        growth_tracker_ = successful;
      }
    }
  }
  per_optimizer_.clear();
  found_inf_any_ = false;
}

Hyperparams GradScaler::state_dict() const {
  if (!o_.enabled) return {};
  return {{"scale", static_cast<double>(scale_)},
          {"growth_factor", o_.growth_factor},
          {"backoff_factor", o_.backoff_factor},
          {"growth_interval", static_cast<double>(o_.growth_interval)},
          {"_growth_tracker", static_cast<double>(growth_tracker_)}};
}

void GradScaler::load_state_dict(const Hyperparams& sd) {
  const char* op = "GradScaler.load_state_dict";
  if (!o_.enabled) return;
  if (sd.empty())
    throw ValueError(op, "The source state dict is empty, possibly because it was saved from a disabled instance "
                         "of GradScaler.");
  const double scale = hyper_number(sd, "scale", op);
  const double growth = hyper_number(sd, "growth_factor", op);
  const double backoff = hyper_number(sd, "backoff_factor", op);
  const double interval = hyper_number(sd, "growth_interval", op);
  const double tracker = hyper_number(sd, "_growth_tracker", op);
  scale_ = static_cast<float>(scale);
  o_.growth_factor = growth;
  o_.backoff_factor = backoff;
  o_.growth_interval = static_cast<std::int64_t>(interval);
  growth_tracker_ = static_cast<std::int64_t>(tracker);
}

}  // namespace dopt::optim
