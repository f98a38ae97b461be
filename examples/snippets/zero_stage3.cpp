// Quoted by docs/zero-stage2-3.md, "Stage 3" (tests/check_docs.py checks the quotes; CI compiles this file).
#include "dopt/actors/simulate.hpp"
#include "dopt/distributed/zero_stage3.hpp"
#include "dopt/optim/adam.hpp"
#include "common.hpp"

void zero_stage3(int steps) {
  dopt::simulate(4, [&](dopt::RankContext& ctx) {
    using namespace dopt::optim;
    std::vector<std::vector<dopt::Tensor>> layers{snippets::make_model(), snippets::make_model()};
    ShardedUnits model(layers, AdamOptions(1e-3), ShardedUnitsOptions{ctx.world()});   // keeps 1/4 of each layer
    layers.clear();                                    // the full parameters are not needed any more
    const std::size_t n = model.num_units();
    for (int step = 0; step < steps; ++step) {
      for (std::size_t u = 0; u < n; ++u) {            // forward
        std::vector<dopt::Tensor> w = model.gather(u);  // the full parameters of layer u
        if (u + 1 < n) model.prefetch(u + 1);          // the next all_gather overlaps this layer's compute
        /* ... the layer's forward with w ... */
        model.release(u);
      }
      for (std::size_t u = n; u-- > 0;) {              // backward, last layer first
        std::vector<dopt::Tensor> w = model.gather(u);
        /* ... the input's gradient, which needs w ... */
        std::vector<dopt::Tensor> g = model.release_for_gradients(u);  // w's memory, zeroed, in w's shapes
        if (u > 0) model.prefetch(u - 1);              // the next all_gather overlaps the gradients' compute
        for (std::size_t i = 0; i < g.size(); ++i)     // the parameters' gradients are written there
          g[i].copy_(snippets::local_grad(g[i], ctx.rank()));
        model.reduce_gradients(u);                     // in place: this rank keeps the average of its shard
      }
      model.step();                                    // local: each rank steps its shards
    }
  });
}
