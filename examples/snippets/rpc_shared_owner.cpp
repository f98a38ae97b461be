// Several trainers share one parameter owner, with no lock of their own
// (docs/rpc.md, "Sharing one owner between trainers", quotes this file;
// tests/check_docs.py checks the quote). The owner (worker 0) keeps the
// parameter and its optimizer in one value and hands an RRef to it to every
// trainer; the trainers update it with methods of that value, which the owner
// runs one at a time in the value's strand. Runs either way:
//   dopt-snippet-rpc-shared-owner                              (3 simulated workers)
//   dopt-run --nproc-per-node 3 dopt-snippet-rpc-shared-owner  (3 processes)
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/optim/sgd.hpp"
using namespace dopt;

// The shared state: a parameter, its optimizer and a count of the updates.
// Only the owner ever holds one; trainers hold RRef<SharedParameter>.
struct SharedParameter {
  Tensor weight = Tensor::zeros({8});
  std::shared_ptr<optim::SGD> sgd = std::make_shared<optim::SGD>(std::vector<Tensor>{weight}, optim::SGDOptions(0.5));
  std::int64_t updates = 0;
};

constexpr int kStepsPerTrainer = 50;

void register_everywhere() {
  // A method of the shared value: it runs on the owner, in the value's strand,
  // so two trainers' calls never interleave inside it.
  rpc::register_method<SharedParameter>("apply_gradient", [](SharedParameter& s, Tensor grad) {
    s.weight.set_grad(grad);
    s.sgd->step();
    return ++s.updates;  // the update's number, in the owner's order
  });
  rpc::register_method<SharedParameter>("read", [](SharedParameter& s) { return s.weight.clone(); });
  // A trainer's loop: runs on the trainer's pool (it may block on calls).
  rpc::register_function("train", [](rpc::RRef<SharedParameter> shared) {
    for (int k = 0; k < kStepsPerTrainer; ++k)
      shared.rpc_sync<std::int64_t>("apply_gradient", Tensor::full({8}, 1.0));
    return true;
  });
}

int main() {
  register_everywhere();
  int failed = 0;
  rpc::run(
      [&](rpc::Agent& agent) {
        if (agent.rank() != 0) return;  // trainers serve "train" until the owner is done
        rpc::RRef<SharedParameter> shared = agent.make_rref(SharedParameter{});
        std::vector<Future<bool>> trainers;
        for (int t = 1; t < agent.world_size(); ++t)
          trainers.push_back(agent.rpc_async<bool>(t, "train", shared));  // each gets an RRef
        for (auto& f : trainers) f.get();

        const std::int64_t want = kStepsPerTrainer * (agent.world_size() - 1);
        const std::int64_t got = shared.rpc_sync<std::int64_t>("apply_gradient", Tensor::zeros({8}));
        const float w = shared.rpc_sync<Tensor>("read").data<float>()[0];
        std::printf("%lld updates from %d trainers, weight %g\n", static_cast<long long>(got - 1),
                    agent.world_size() - 1, w);
        // Every update applied once, none lost to a race: -0.5 per update.
        if (got - 1 != want || w != -0.5f * static_cast<float>(want)) failed = 1;
      },
      3);
  return failed;
}
