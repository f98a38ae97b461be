// Quoted by docs/checkpointing.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/distributed/checkpointer.hpp"
#include "dopt/distributed/trainer.hpp"
#include "dopt/distributed/zero.hpp"
#include "dopt/runtime/distributed_sampler.hpp"

void train_with_checkpoints(dopt::RankContext& ctx, std::int64_t steps) {
  std::vector<dopt::Tensor> params = snippets::make_model();
  dopt::optim::ZeroRedundancyOptimizer opt(params, dopt::optim::OptimizerSpec{"Adam", {{"lr", 1e-3}}},
                                            dopt::optim::ZeroOptions{ctx.world()});
  dopt::DistributedSampler sampler(50000, ctx.world_size(), ctx.rank());
  std::int64_t offset = 0;                      // samples this rank took of the epoch
  std::mt19937_64 dropout_rng(ctx.rank());      // each rank's own
  std::map<std::string, std::string> notes{{"model", "mlp-8x4"}};

  dopt::CheckpointerOptions options;
  options.group = ctx.world();
  options.dir = "checkpoints";
  options.keep_last = 3;
  dopt::Checkpointer ckpt(options);             // every rank, in the same order
  ckpt.add_tensors("model", {{"fc.weight", params[0]}, {"fc.bias", params[1]}}, dopt::Placement::replicated);
  ckpt.add_optimizer("optim", opt);             // ZeRO: its shards, reshard at load
  ckpt.add_data_position("data", sampler, offset);
  ckpt.add_rng("dropout", dropout_rng, dopt::Placement::per_rank);
  ckpt.add_extras("notes", notes, dopt::Placement::replicated);

  const std::int64_t first = ckpt.load_latest().value_or(0);  // resume, or start at 0
  dopt::Future<void> saving;
  for (std::int64_t step = first; step < steps; ++step) {
    for (auto& p : params) p.set_grad(snippets::local_grad(p, ctx.rank()));  // your forward and backward
    dopt::average_gradients(params, ctx.world());
    opt.step();
    offset += 32;
    if ((step + 1) % 100 == 0) {
      if (saving.valid()) saving.get();         // the previous save's error, if it failed
      saving = ckpt.save_async(step + 1);       // returns after the snapshot; written in the background
    }
  }
  ckpt.wait();  // the last save is committed (or its error thrown)
}
