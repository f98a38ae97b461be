// Join: training with uneven inputs. Rank r has 3 + r batches, so rank 0 runs
// out first. Without Join it would stop calling the collectives its peers
// still wait for (a hang, then a TimeoutError). Under dopt::Join, a rank that
// ran out calls finish(): until every rank is done it "shadows" the others'
// collectives (the Reducer's gradient all-reduce, ZeRO's step and broadcasts),
// counting itself as zeros in the gradient averages.
//
//   dopt-example-join   (or: dopt-run --nproc-per-node 4 dopt-example-join)
#include <cstdio>
#include <vector>

#include "dopt/actors/distributed.hpp"
#include "dopt/actors/join.hpp"
#include "dopt/distributed/reducer.hpp"
#include "dopt/distributed/zero.hpp"

using dopt::Tensor;
using namespace dopt::optim;

namespace {

void train(dopt::RankContext& ctx) {
  const int rank = ctx.rank(), n = ctx.world_size();
  std::vector<Tensor> params{Tensor::full({32, 8}, 0.5), Tensor::zeros({32}), Tensor::full({8, 32}, 0.25)};
  Reducer reducer(params, ctx.world());
  ZeroRedundancyOptimizer zero(params, OptimizerSpec{"SGD", {{"lr", 0.1}}}, ZeroOptions{ctx.world()});

  const int my_batches = 3 + rank;  // uneven inputs
  dopt::Join join({&reducer, &zero});  // the reducer (first) notifies the join context
  for (int b = 0; b < my_batches; ++b) {
    for (std::size_t i = params.size(); i-- > 0;) {
      params[i].set_grad(Tensor::full(params[i].shape(), 0.01 * (rank + 1)));
      reducer.mark_ready(params[i]);
    }
    reducer.finalize();
    zero.step();
  }
  join.finish();  // shadows the others' iterations until every rank is done
  std::printf("rank %d: %d batches of its own, then shadowed %lld iteration(s) of the others\n", rank, my_batches,
              static_cast<long long>(join.iterations()));

  // ZeRO broadcast every parameter from its owner at every step, the shadowed
  // ones included: the ranks end with identical parameters.
  Tensor mine = params[0].clone().flatten();
  std::vector<Tensor> all;
  for (int r = 0; r < n; ++r) all.push_back(Tensor::empty({mine.numel()}));
  ctx.world().all_gather(all, mine);
  bool same = true;
  for (const Tensor& t : all) same = same && t.equal(all[0]);
  if (rank == 0) std::printf("parameters identical on all %d ranks after the join: %s\n", n, same ? "yes" : "NO");
  if (!same) throw dopt::StateError("join example", "the ranks' parameters differ");
}

}  // namespace

int main() {
  try {
    dopt::RunOptions options;
    options.simulated_ranks = 4;
    dopt::run_distributed(train, options);
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
