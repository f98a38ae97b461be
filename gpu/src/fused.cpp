#include "dopt/gpu/fused.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>
#include <tuple>

#include "cuda_util.hpp"
#include "dopt/optim/internal/device_step.hpp"
#include "dopt/optim/adadelta.hpp"
#include "dopt/optim/adagrad.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/adamax.hpp"
#include "dopt/optim/adamw.hpp"
#include "dopt/optim/rmsprop.hpp"
#include "dopt/optim/rprop.hpp"
#include "dopt/optim/sgd.hpp"
#include "multi_tensor.hpp"

namespace dopt::gpu {
namespace {

using detail::FusedOp;
using detail::FusedScalars;
using namespace dopt::optim;

bool is_16bit(DType d) { return d == DType::float16 || d == DType::bfloat16; }

// The step counter, incremented in its own dtype's arithmetic (as the CPU path).
double increment_step(Tensor& step_t) {
  double s;
  if (step_t.dtype() == DType::float32) s = static_cast<double>(static_cast<float>(step_t.item()) + 1.0f);
  else s = step_t.item() + 1.0;
  step_t.fill_(s);
  return s;
}

// The scalars that every optimizer with L2 weight decay (all but Rprop)
// sets alike: maximize, weight_decay and whether it is non-zero, and eps
// where the options have one (all but SGD).
template <class Options>
void set_shared(FusedScalars& k, const Options& o) {
  k.maximize = o.maximize();
  k.wd = o.weight_decay();
  k.has_wd = o.weight_decay() != 0.0;
  if constexpr (requires { o.eps(); }) k.eps = o.eps();
}

// A moment's decay d and 1 - d: the first moment's in beta1, the second's
// in beta2 (also RMSprop's alpha and Adadelta's rho).
void set_beta1(FusedScalars& k, double d) {
  k.beta1 = d;
  k.one_minus_beta1 = 1.0 - d;
}
void set_beta2(FusedScalars& k, double d) {
  k.beta2 = d;
  k.one_minus_beta2 = 1.0 - d;
}

// What one kind of optimizer needs from the host side.
struct Kind {
  FusedOp op;
  const char* name;          // "Adam.step" style op name for errors
  std::vector<const char*> state_keys;  // in pointer-slot order (slots 2, 3, 4); null = empty slot
  bool counts_steps = true;
  bool step_in_scalars = false;  // bias correction / lr decay depend on the step
};

struct Item {
  Tensor param, grad;
  ParamState* st;
  double step = 0;  // after the increment
  int mom_mode = 0;
  DType state_dtype;
  bool master = false;
};

class Stepper {
 public:
  Stepper(const OptimizerOptions& o, const FusedOptions& f) : options_(o), fused_(f) { identify(); }

  void run(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
           const std::vector<ParamState*>& states, Stream& stream) {
    if (params.size() != grads.size() || params.size() != states.size())
      throw ValueError(kind_.name, "got " + std::to_string(params.size()) + " parameters, " +
                                       std::to_string(grads.size()) + " gradients and " +
                                       std::to_string(states.size()) + " states");
    options_.validate(kind_.name);
    std::vector<Item> items;
    // Check everything before changing anything.
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      check_pair(params[i], grads[i], stream, i);
      if (!states[i]) throw ValueError(kind_.name, "state " + std::to_string(i) + " is null");
      check_state(params[i], *states[i]);
      items.push_back(Item{params[i], grads[i], states[i], 0, 0, params[i].dtype(), false});
    }
    // Create lazy state, count steps, pick the state dtype.
    for (Item& it : items) {
      ParamState& st = *it.st;
      if (st.empty()) init_state(it.param, st);
      if (fused_.master_weights && is_16bit(it.param.dtype()) &&
          (!st.count("master_param") || !st.at("master_param").defined()))
        st["master_param"] = it.param.to(DType::float32);
      if (kind_.counts_steps) it.step = increment_step(st.at("step"));
      if (kind_.op == FusedOp::sgd) prepare_sgd(it);
      it.state_dtype = state_dtype_of(it);
      it.master = is_16bit(it.param.dtype()) && st.count("master_param") && st.at("master_param").defined();
    }
    // Bucket by what the kernel instance and its scalars depend on.
    using Key = std::tuple<int, int, bool, double, int>;  // param dtype, state dtype, master, step, mom_mode
    std::map<Key, std::vector<const Item*>> buckets;
    for (const Item& it : items)
      buckets[Key{static_cast<int>(it.param.dtype()), static_cast<int>(it.state_dtype), it.master,
                  kind_.step_in_scalars ? it.step : 0.0, it.mom_mode}]
          .push_back(&it);
    detail::DeviceGuard dg(stream.device());
    for (auto& [key, list] : buckets) launch(list, scalars(std::get<3>(key), std::get<4>(key)), stream);
    // The kernels' tensors stay allocated until the kernels are done.
    std::vector<Tensor> keep;
    for (const Item& it : items) {
      keep.push_back(it.param);
      keep.push_back(it.grad);
      for (const auto& [k, t] : *it.st)
        if (t.defined() && t.device().is_cuda()) keep.push_back(t);
    }
    detail::keep_until_done(stream, std::move(keep), kind_.name);
  }

 private:
  void identify() {
    if (auto* o = dynamic_cast<const SGDOptions*>(&options_)) {
      kind_ = {FusedOp::sgd, "SGD.step", {"momentum_buffer", nullptr, nullptr}, false, false};
      sgd_ = o;
    } else if (auto* o = dynamic_cast<const AdamWOptions*>(&options_)) {
      kind_ = {FusedOp::adam, "AdamW.step", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, true, true};
      adam_ = o->as_adam_options();
      decoupled_ = true;
    } else if (auto* o = dynamic_cast<const AdamOptions*>(&options_)) {
      kind_ = {FusedOp::adam, "Adam.step", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, true, true};
      adam_ = *o;
    } else if (auto* o = dynamic_cast<const AdagradOptions*>(&options_)) {
      kind_ = {FusedOp::adagrad, "Adagrad.step", {"sum", nullptr, nullptr}, true, true};
      adagrad_ = o;
    } else if (auto* o = dynamic_cast<const RMSpropOptions*>(&options_)) {
      kind_ = {FusedOp::rmsprop, "RMSprop.step", {"square_avg", "grad_avg", "momentum_buffer"}, true, false};
      rmsprop_ = o;
    } else if (auto* o = dynamic_cast<const AdamaxOptions*>(&options_)) {
      kind_ = {FusedOp::adamax, "Adamax.step", {"exp_avg", "exp_inf", nullptr}, true, true};
      adamax_ = o;
    } else if (auto* o = dynamic_cast<const AdadeltaOptions*>(&options_)) {
      kind_ = {FusedOp::adadelta, "Adadelta.step", {"square_avg", "acc_delta", nullptr}, true, false};
      adadelta_ = o;
    } else if (auto* o = dynamic_cast<const RpropOptions*>(&options_)) {
      kind_ = {FusedOp::rprop, "Rprop.step", {"prev", "step_size", nullptr}, true, false};
      rprop_ = o;
    } else {
      throw NotSupportedError("gpu::fused_step", "no fused kernel for these optimizer options");
    }
  }

  // Which state slots this configuration uses (a slot's key may be absent otherwise).
  bool slot_used(int slot) const {
    const char* key = kind_.state_keys[static_cast<std::size_t>(slot)];
    if (!key) return false;
    switch (kind_.op) {
      case FusedOp::sgd: return sgd_->momentum() != 0.0;
      case FusedOp::adam: return slot < 2 || adam_.amsgrad();
      case FusedOp::rmsprop:
        if (slot == 1) return rmsprop_->centered();
        if (slot == 2) return rmsprop_->momentum() > 0.0;
        return true;
      default: return true;
    }
  }

  void check_pair(const Tensor& p, const Tensor& g, Stream& stream, std::size_t i) const {
    const std::string what = "parameter " + std::to_string(i);
    if (!p.defined()) throw ValueError(kind_.name, what + " is undefined");
    if (!p.device().is_cuda() || p.device().index != stream.device())
      throw DeviceError(kind_.name, what + " is on " + p.device().str() + ", the stream on cuda:" +
                                        std::to_string(stream.device()));
    const DType d = p.dtype();
    if (d != DType::float32 && d != DType::float64 && !is_16bit(d))
      throw DTypeError(kind_.name, what + " has dtype " + std::string(dtype_name(d)) +
                                       "; the fused kernels take float32, float64, float16 and bfloat16");
    if (g.device() != p.device())
      throw DeviceError(kind_.name, "gradient " + std::to_string(i) + " is on " + g.device().str() +
                                        ", its parameter on " + p.device().str());
    check_same_dtype(g, p, kind_.name);
    check_same_shape(g, p, kind_.name);
  }

  void check_state(const Tensor& p, const ParamState& st) const {
    if (st.empty()) return;
    if (kind_.op == FusedOp::adam && adam_.amsgrad() && !st.count("max_exp_avg_sq"))
      throw StateError(kind_.name, "amsgrad was enabled after the state of this parameter was created");
    if (kind_.op == FusedOp::rmsprop) {
      if (rmsprop_->momentum() > 0.0 && !st.count("momentum_buffer"))
        throw StateError(kind_.name, "momentum was enabled after the state of this parameter was created (no "
                                     "'momentum_buffer'; torch raises KeyError here)");
      if (rmsprop_->centered() && !st.count("grad_avg"))
        throw StateError(kind_.name, "centered was enabled after the state of this parameter was created (no "
                                     "'grad_avg'; torch raises KeyError here)");
    }
    if (kind_.counts_steps && (!st.count("step") || !st.at("step").defined()))
      throw StateError(kind_.name, "parameter state has no 'step' entry");
    std::vector<const char*> keys;
    for (int s = 0; s < 3; ++s)
      if (slot_used(s) && st.count(kind_.state_keys[static_cast<std::size_t>(s)]))
        keys.push_back(kind_.state_keys[static_cast<std::size_t>(s)]);
    if (st.count("master_param")) keys.push_back("master_param");
    for (const char* key : keys) {
      const Tensor& t = st.at(key);
      if (!t.defined()) continue;
      const bool ok_dtype = std::strcmp(key, "master_param") == 0
                                ? t.dtype() == DType::float32
                                : (t.dtype() == p.dtype() || (is_16bit(p.dtype()) && t.dtype() == DType::float32));
      if (t.numel() != p.numel() || t.device() != p.device() || !ok_dtype)
        throw StateError(kind_.name, std::string("state '") + key + "' " + t.str() + " does not match parameter " +
                                         p.str());
    }
    // Every state a used slot needs must be there (SGD's buffer is lazy).
    for (int s = 0; s < 3; ++s) {
      if (!slot_used(s) || kind_.op == FusedOp::sgd) continue;
      const char* key = kind_.state_keys[static_cast<std::size_t>(s)];
      if (!st.count(key) || !st.at(key).defined())
        throw StateError(kind_.name, std::string("parameter state has no '") + key + "' entry");
    }
    // One kernel instance per (param dtype, state dtype): the used state tensors share a dtype.
    const Tensor* first = nullptr;
    for (int s = 0; s < 3; ++s) {
      if (!slot_used(s)) continue;
      auto f = st.find(kind_.state_keys[static_cast<std::size_t>(s)]);
      if (f == st.end() || !f->second.defined()) continue;
      if (first && f->second.dtype() != first->dtype())
        throw StateError(kind_.name, std::string("state '") + f->first + "' is " +
                                         std::string(dtype_name(f->second.dtype())) + ", the other state " +
                                         std::string(dtype_name(first->dtype())) + "; they must share a dtype");
      if (!first) first = &f->second;
    }
  }

  DType new_state_dtype(const Tensor& p) const {
    return is_16bit(p.dtype()) && (fused_.fp32_state || fused_.master_weights) ? DType::float32 : p.dtype();
  }

  // The CPU path's init_param_state, with the state dtype chosen above.
  void init_state(const Tensor& p, ParamState& st) const {
    const DType sd = new_state_dtype(p);
    auto zeros = [&] { return Tensor::zeros(p.shape(), sd, p.device()); };
    switch (kind_.op) {
      case FusedOp::sgd: break;  // the momentum buffer is created by the first momentum step
      case FusedOp::adam:
        st["step"] = Tensor::scalar(0.0, DType::float32);
        st["exp_avg"] = zeros();
        st["exp_avg_sq"] = zeros();
        if (adam_.amsgrad()) st["max_exp_avg_sq"] = zeros();
        break;
      case FusedOp::adagrad:
        st["step"] = Tensor::scalar(0.0, DType::float32);
        st["sum"] = Tensor::full(p.shape(), adagrad_->initial_accumulator_value(), sd, p.device());
        break;
      case FusedOp::rmsprop:
        st["step"] = Tensor::scalar(0.0, DType::int64);
        st["square_avg"] = zeros();
        if (rmsprop_->momentum() > 0.0) st["momentum_buffer"] = zeros();
        if (rmsprop_->centered()) st["grad_avg"] = zeros();
        break;
      case FusedOp::adamax:
        st["step"] = Tensor::scalar(0.0, DType::float32);
        st["exp_avg"] = zeros();
        st["exp_inf"] = zeros();
        break;
      case FusedOp::adadelta:
        st["step"] = Tensor::scalar(0.0, DType::int64);
        st["square_avg"] = zeros();
        st["acc_delta"] = zeros();
        break;
      case FusedOp::rprop:
        st["step"] = Tensor::scalar(0.0, DType::int64);
        st["prev"] = zeros();
        st["step_size"] = Tensor::full(p.shape(), rprop_->lr(), sd, p.device());
        break;
    }
  }

  void prepare_sgd(Item& it) const {
    if (sgd_->momentum() == 0.0) return;
    ParamState& st = *it.st;
    auto f = st.find("momentum_buffer");
    if (f == st.end() || !f->second.defined()) {
      st["momentum_buffer"] = Tensor::empty(it.param.shape(), new_state_dtype(it.param), it.param.device());
      it.mom_mode = 1;
    } else {
      it.mom_mode = 2;
    }
  }

  DType state_dtype_of(const Item& it) const {
    for (int s = 0; s < 3; ++s) {
      if (!slot_used(s)) continue;
      const Tensor& t = it.st->at(kind_.state_keys[static_cast<std::size_t>(s)]);
      return t.dtype();
    }
    return it.param.dtype();  // SGD without momentum: no state
  }

  // The CPU path's scalars (optim/src/<opt>.cpp), in double.
  FusedScalars scalars(double s, int mom_mode) const {
    FusedScalars k;
    switch (kind_.op) {
      case FusedOp::sgd: {
        const SGDOptions& o = *sgd_;
        set_shared(k, o);
        k.momentum = o.momentum();
        k.one_minus_dampening = 1.0 - o.dampening();
        k.neg_lr = -o.lr();
        k.nesterov = o.nesterov();
        k.mom_mode = mom_mode;
        break;
      }
      case FusedOp::adam: {
        const AdamOptions& o = adam_;
        const double beta1 = o.betas()[0], beta2 = o.betas()[1];
        const double bc1 = 1.0 - std::pow(beta1, s);
        const double bc2 = 1.0 - std::pow(beta2, s);
        const double step_size = o.lr() / bc1;
        set_beta1(k, beta1);
        set_beta2(k, beta2);
        set_shared(k, o);
        k.neg_lr = -step_size;
        k.bc2_sqrt = std::sqrt(bc2);
        k.decay_mul = 1.0 - o.lr() * o.weight_decay();
        k.decoupled = decoupled_;
        k.amsgrad = o.amsgrad();
        break;
      }
      case FusedOp::adagrad: {
        const AdagradOptions& o = *adagrad_;
        const double clr = o.lr() / (1.0 + (s - 1.0) * o.lr_decay());
        set_shared(k, o);
        k.neg_lr = -clr;
        break;
      }
      case FusedOp::rmsprop: {
        const RMSpropOptions& o = *rmsprop_;
        set_shared(k, o);
        set_beta2(k, o.alpha());
        k.momentum = o.momentum();
        k.neg_lr = -o.lr();
        k.centered = o.centered();
        k.has_momentum = o.momentum() > 0.0;
        break;
      }
      case FusedOp::adamax: {
        const AdamaxOptions& o = *adamax_;
        const double beta1 = o.betas()[0], beta2 = o.betas()[1];
        const double clr = o.lr() / (1.0 - std::pow(beta1, s));
        set_shared(k, o);
        set_beta1(k, beta1);
        k.beta2 = beta2;  // (Adamax's infinity norm has no 1 - beta2)
        k.neg_lr = -clr;
        break;
      }
      case FusedOp::adadelta: {
        const AdadeltaOptions& o = *adadelta_;
        set_shared(k, o);
        set_beta2(k, o.rho());
        k.neg_lr = -o.lr();
        break;
      }
      case FusedOp::rprop: {
        const RpropOptions& o = *rprop_;
        k.maximize = o.maximize();
        k.etaplus = o.etas()[1];
        k.etaminus = o.etas()[0];
        k.step_min = o.step_sizes()[0];
        k.step_max = o.step_sizes()[1];
        break;
      }
    }
    return k;
  }

  void launch(const std::vector<const Item*>& list, const FusedScalars& k, Stream& stream) const {
    std::vector<std::int64_t> numels;
    numels.reserve(list.size());
    for (const Item* it : list) numels.push_back(it->param.numel());
    const int pdt = static_cast<int>(list.front()->param.dtype());
    const int sdt = static_cast<int>(list.front()->state_dtype);
    for (const detail::LaunchPlan& plan : detail::plan_multi_tensor(numels)) {
      detail::TensorListMeta meta;
      std::memset(&meta, 0, sizeof(meta));
      for (std::size_t slot = 0; slot < plan.tensors.size(); ++slot) {
        const Item& it = *list[static_cast<std::size_t>(plan.tensors[slot])];
        meta.ptr[0][slot] = it.param.data_ptr();
        meta.ptr[1][slot] = it.grad.data_ptr();
        for (int s = 0; s < 3; ++s)
          if (slot_used(s)) meta.ptr[2 + s][slot] = it.st->at(kind_.state_keys[static_cast<std::size_t>(s)]).data_ptr();
        if (it.master) meta.ptr[5][slot] = it.st->at("master_param").data_ptr();
        meta.numel[slot] = it.param.numel();
      }
      for (std::size_t b = 0; b < plan.blocks.size(); ++b) {
        meta.block_tensor[b] = static_cast<unsigned char>(plan.blocks[b].first);
        meta.block_chunk[b] = plan.blocks[b].second;
      }
      try {
        detail::launch_fused(kind_.op, pdt, sdt, meta, static_cast<int>(plan.blocks.size()), k, stream.native());
      } catch (const std::exception& e) {
        throw DeviceError(kind_.name, e.what());
      }
    }
  }

  const OptimizerOptions& options_;
  FusedOptions fused_;
  Kind kind_{};
  const SGDOptions* sgd_ = nullptr;
  AdamOptions adam_;
  bool decoupled_ = false;
  const AdagradOptions* adagrad_ = nullptr;
  const RMSpropOptions* rmsprop_ = nullptr;
  const AdamaxOptions* adamax_ = nullptr;
  const AdadeltaOptions* adadelta_ = nullptr;
  const RpropOptions* rprop_ = nullptr;
};

}  // namespace

bool has_fused_kernel(const OptimizerOptions& o) noexcept {
  return dynamic_cast<const SGDOptions*>(&o) || dynamic_cast<const AdamOptions*>(&o) ||
         dynamic_cast<const AdamWOptions*>(&o) || dynamic_cast<const AdagradOptions*>(&o) ||
         dynamic_cast<const RMSpropOptions*>(&o) || dynamic_cast<const AdamaxOptions*>(&o) ||
         dynamic_cast<const AdadeltaOptions*>(&o) || dynamic_cast<const RpropOptions*>(&o);
}

namespace {

// Enqueues the step's kernels on stream (the three forms share it).
void enqueue_step(const OptimizerOptions& options, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  const std::vector<ParamState*>& states, Stream& stream, const FusedOptions& fused) {
  Stepper(options, fused).run(params, grads, states, stream);
}

void enqueue_step(Optimizer& opt, Stream& stream, const FusedOptions& fused) {
  for (auto& group : opt.param_groups()) {
    std::vector<Tensor> grads;
    std::vector<ParamState*> states;
    for (const Tensor& p : group.params) {
      grads.push_back(p.grad());
      // State only for parameters that step (as Optimizer::step: no empty entries).
      states.push_back(grads.back().defined() ? &opt.state()[p.key()] : nullptr);
    }
    enqueue_step(*group.options, group.params, grads, states, stream, fused);
  }
}

void enqueue_step(FunctionalOptimizer& f, const std::vector<Tensor>& grads, Stream& stream, const FusedOptions& fused) {
  if (grads.size() != f.params().size())
    throw ValueError(f.name() + ".step",
                     "the gradients passed in does not equal to the size of the parameters!Params length: " +
                         std::to_string(f.params().size()) + ". Gradients length: " + std::to_string(grads.size()));
  std::vector<ParamState*> states;
  for (std::size_t i = 0; i < grads.size(); ++i)
    states.push_back(grads[i].defined() ? &f.state()[f.params()[i].key()] : nullptr);
  enqueue_step(f.options(), f.params(), grads, states, stream, fused);
}

// The blocking forms wait on the kernels' event on this thread, not through a
// completion future: they may be called inside a continuation, i.e. on the gpu
// completion dispatcher, which would otherwise wait for itself.
void wait_for(Stream& stream) { detail::wait_for_event(stream.record(), "gpu::fused_step"); }

}  // namespace

Future<void> fused_step_async(const OptimizerOptions& options, const std::vector<Tensor>& params,
                              const std::vector<Tensor>& grads, const std::vector<ParamState*>& states, Stream& stream,
                              const FusedOptions& fused) {
  enqueue_step(options, params, grads, states, stream, fused);
  return stream.completion();
}

void fused_step(const OptimizerOptions& options, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<ParamState*>& states, Stream& stream, const FusedOptions& fused) {
  enqueue_step(options, params, grads, states, stream, fused);
  wait_for(stream);
}

Future<void> fused_step_async(Optimizer& opt, Stream& stream, const FusedOptions& fused) {
  enqueue_step(opt, stream, fused);
  return stream.completion();
}

void fused_step(Optimizer& opt, Stream& stream, const FusedOptions& fused) {
  enqueue_step(opt, stream, fused);
  wait_for(stream);
}

Future<void> fused_step_async(FunctionalOptimizer& f, const std::vector<Tensor>& grads, Stream& stream,
                              const FusedOptions& fused) {
  enqueue_step(f, grads, stream, fused);
  return stream.completion();
}

void fused_step(FunctionalOptimizer& f, const std::vector<Tensor>& grads, Stream& stream, const FusedOptions& fused) {
  enqueue_step(f, grads, stream, fused);
  wait_for(stream);
}

namespace detail {
namespace {

// What Optimizer::step / FunctionalOptimizer::step use for CUDA parameters
// (dopt/optim/internal/device_step.hpp): the fused kernels on the calling thread's
// current stream, then a wait for them, so step() keeps its synchronous
// contract. Asynchronous stepping is fused_step_async.
//
// The wait is on the kernels' event on this thread, not through a completion
// future: step() may be called inside a continuation, i.e. on the gpu
// completion dispatcher, which would otherwise wait for itself.
class FusedStepper final : public optim::detail::DeviceStepper {
 public:
  void step(const OptimizerOptions& options, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
            const std::vector<ParamState*>& states) override {
    if (params.empty()) return;
    Stream& stream = current_stream(params.front().device().index);
    enqueue_step(options, params, grads, states, stream, {});
    wait_for_event(stream.record(), "Optimizer.step");
  }
};

}  // namespace

void register_fused_stepper() {
  static FusedStepper* stepper = new FusedStepper();  // lives until exit
  optim::detail::register_device_stepper(DeviceType::CUDA, stepper);
}

}  // namespace detail

}  // namespace dopt::gpu
