// dopt-train --optim zero --zero-stage 3: ShardedUnits (zero_stage3.hpp)
// with one unit per layer. The model holds no parameters: each layer is
// gathered before its forward (the next one prefetched meanwhile) and
// released after it, and gathered again before its backward; once the
// layer's input gradient is computed its gathered memory takes the
// weight's and bias's gradients (release_for_gradients) and the next layer
// of the backward is prefetched; the gradients are reduced onto their
// shards' owners in place as soon as the layer's backward ends; step()
// steps this rank's shards only. Bit for bit stage 1 (docs/zero-stage2-3.md).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/runtime/error.hpp"
#include "model.hpp"
#include "strategy.hpp"

namespace dopt_train {

using namespace dopt::optim;

namespace {

std::vector<std::vector<Tensor>> layers_of(const std::vector<Tensor>& params) {
  if (params.size() % 2 != 0)
    throw dopt::ValueError("dopt-train", "--zero-stage 3 takes the model's layers as weight and bias pairs");
  std::vector<std::vector<Tensor>> units;
  for (std::size_t k = 0; k < params.size(); k += 2) units.push_back({params[k], params[k + 1]});
  return units;
}

class ZeroStage3Strategy : public Strategy, public LayerSource {
 public:
  ZeroStage3Strategy(const StrategyConfig& cfg, const std::vector<Tensor>& params, dopt::ProcessGroup world)
      : units_(layers_of(params), cfg.inner, ShardedUnitsOptions{world}) {
    const int n = world.size();
    const std::int64_t bytes = nbytes_of(params);
    // Each unit is all-gathered twice (forward, backward): (n - 1) / n of
    // its bytes sent per rank each time; the reduce of the gradients sends
    // every other rank's shard once: (n - 1) / n again.
    per_step_ = n <= 1 ? 0 : static_cast<std::uint64_t>(bytes) * 3 * static_cast<std::uint64_t>(n - 1) /
                                 static_cast<std::uint64_t>(n);
  }

  std::string describe() const override { return "ZeRO(" + units_.optim().name() + "), stage 3"; }
  void grad_ready(const Tensor& /*p*/) override {}  // done(layer, backward) reduces a whole layer
  void finish_step() override {
    units_.step();
    sent_ += per_step_;
  }
  std::int64_t state_bytes() const override { return optimizer_state_bytes(units_.optim()); }
  std::int64_t owned_numel() const override {
    std::int64_t n = 0;
    for (std::size_t u = 0; u < units_.num_units(); ++u) n += units_.shard_numel(u);
    return n;
  }
  std::int64_t gradient_bytes() const override {
    std::int64_t b = 0;
    for (std::size_t u = 0; u < units_.num_units(); ++u)
      if (units_.shard(u).grad().defined()) b += static_cast<std::int64_t>(units_.shard(u).grad().nbytes());
    return b;
  }
  std::int64_t param_bytes() const override {
    std::int64_t b = 0;
    for (std::size_t u = 0; u < units_.num_units(); ++u) b += static_cast<std::int64_t>(units_.shard(u).nbytes());
    return b;
  }
  // The parameters live only in the shards: one sharded item, "optim",
  // holds them with the optimizer state (no "model" item).
  void add_to(dopt::Checkpointer& ckpt, const std::map<std::string, Tensor>& /*params*/) override {
    ckpt.add_optimizer("optim", units_);
  }
  double lr() const override { return units_.optim().param_groups()[0].options->get_lr(); }
  std::uint64_t bytes_sent() const override { return sent_; }

  LayerSource* layer_source() override { return this; }
  std::vector<Tensor> full_params() override { return units_.full_parameters(); }
  std::vector<Tensor> local_params() const override {
    std::vector<Tensor> out;
    for (std::size_t u = 0; u < units_.num_units(); ++u) out.push_back(units_.shard(u));
    return out;
  }
  std::vector<std::string> local_param_names() const override {
    std::vector<std::string> out;
    for (std::size_t u = 0; u < units_.num_units(); ++u)
      out.push_back("shard of layer " + std::to_string(u + 1) + " (fc" + std::to_string(u + 1) + ")");
    return out;
  }

  // LayerSource: gather the layer (the prefetched one arrives here), prefetch
  // the next in the forward's order, release after use. In the backward the
  // gathered memory becomes the gradients' and the next layer is prefetched
  // then, into the buffer of the reduction that release_for_gradients waited
  // for: two layers' buffers at a time, not three.
  std::pair<Tensor, Tensor> acquire(int layer, bool backward) override {
    const auto u = static_cast<std::size_t>(layer);
    std::vector<Tensor> full = units_.gather(u);
    if (!backward && u + 1 < units_.num_units()) (void)units_.prefetch(u + 1);
    return {full[0], full[1]};
  }
  std::pair<Tensor, Tensor> gradients(int layer) override {
    const auto u = static_cast<std::size_t>(layer);
    std::vector<Tensor> g = units_.release_for_gradients(u);
    if (u > 0) (void)units_.prefetch(u - 1);
    return {g[0], g[1]};
  }
  void done(int layer, bool backward, const Tensor& /*w*/, const Tensor& /*b*/) override {
    const auto u = static_cast<std::size_t>(layer);
    // The last layer's forward is followed at once by its backward: kept.
    if (!backward && u + 1 == units_.num_units()) return;
    if (backward)
      (void)units_.reduce_gradients_async(u);  // in place: the buffers gradients(layer) handed out
    else
      units_.release(u);
  }

 private:
  ShardedUnits units_;
  std::uint64_t per_step_ = 0, sent_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_zero_stage3(const StrategyConfig& cfg, const std::vector<Tensor>& params,
                                           dopt::ProcessGroup world) {
  return std::make_unique<ZeroStage3Strategy>(cfg, params, world);
}

}  // namespace dopt_train
