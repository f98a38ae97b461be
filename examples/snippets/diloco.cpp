// Quoted by docs/diloco.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <memory>
#include <string>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/adamw.hpp"
#include "dopt/distributed/diloco.hpp"
#include "dopt/distributed/post_local_sgd.hpp"
#include "dopt/runtime/state_dict.hpp"
#include "common.hpp"

void diloco_quick_start(int steps) {
  dopt::simulate(3, [steps](dopt::RankContext& ctx) {
    using namespace dopt::optim;
    std::vector<dopt::Tensor> params = snippets::make_model();  // the same initial values on every rank
    DiLoCoOptions o;                                             // outer: SGD(lr 0.7, momentum 0.9, nesterov)
    o.sync_every = 100;                                          // H inner steps per synchronisation
    auto inner = std::make_unique<AdamW>(params, AdamWOptions(1e-3));
    PostLocalSGDOptimizer opt(std::move(inner),
                              std::make_unique<DiLoCoAverager>(params, o, ctx.world()));
    for (int step = 0; step < steps; ++step) {
      for (auto& p : params) p.set_grad(snippets::local_grad(p, ctx.rank()));
      opt.step();
      opt.zero_grad(true);
    }
  });
}

void diloco_sharded_checkpoint(dopt::optim::PostLocalSGDOptimizer& opt, dopt::optim::DiLoCoAverager& diloco,
                               const std::string& my_file, const std::string& dir) {
  using namespace dopt;
  diloco.set_sharded_checkpoints(true);           // state_dict() leaves them out
  save_state_dict(opt.state_dict(), my_file);     // this rank's own part (inner state, residuals, step)
  diloco.save_sharded(dir);                       // parameters i with i % n == rank: dir/diloco-rank{r}-of-{n}.safetensors
  // ...
  opt.load_state_dict(load_state_dict(my_file));
  diloco.load_sharded(dir);                       // reads every shard of the set
}
