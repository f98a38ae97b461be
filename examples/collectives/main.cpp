// Collectives: every rank runs the same function; ctx.world() is the group
// of all ranks. Runs 4 simulated ranks in this process, or, started by
// dopt-run (`dopt-run --nproc-per-node 4 dopt-example-collectives`), one rank
// per process: the code is the same.
#include <cstdio>
#include <string>
#include <vector>

#include "dopt/actors/distributed.hpp"

using dopt::Tensor;

namespace {

std::string str(const Tensor& t) {
  std::string s = "[";
  for (std::int64_t i = 0; i < t.numel(); ++i) s += (i ? ", " : "") + std::to_string(static_cast<int>(t.at(i)));
  return s + "]";
}

void collectives(dopt::RankContext& ctx) {
  dopt::ProcessGroup& world = ctx.world();
  const int rank = ctx.rank(), n = ctx.world_size();
  auto say = [&](const std::string& what) {
    if (rank == 0) std::printf("%s\n", what.c_str());
  };

  // broadcast: rank 0's values everywhere.
  Tensor b = Tensor::full({3}, rank == 0 ? 7 : -1);
  world.broadcast(b, /*src=*/0);
  say("broadcast from rank 0:        " + str(b));

  // all_reduce (SUM, in rank order: bit-identical on every rank and every run).
  Tensor s = Tensor::full({3}, rank + 1);
  world.all_reduce(s);
  say("all_reduce of rank + 1:       " + str(s));

  // all_gather: one tensor per rank.
  std::vector<Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(Tensor::empty({2}));
  world.all_gather(parts, Tensor::full({2}, rank * 10));
  std::string g;
  for (const Tensor& p : parts) g += str(p) + " ";
  say("all_gather of rank * 10:      " + g);

  // reduce_scatter: rank r gets the sum of everybody's inputs[r].
  std::vector<Tensor> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(Tensor::full({2}, r));
  Tensor mine = Tensor::empty({2});
  world.reduce_scatter(mine, inputs);
  say("reduce_scatter, rank 0 gets:  " + str(mine));

  // Asynchronous: start the collective, do other work, then wait, or attach a
  // continuation with then() (it runs on a runtime thread: keep it short).
  Tensor a = Tensor::full({1}, 1);
  dopt::Future<void> f = world.all_reduce_async(a);
  dopt::Future<double> doubled = f.then([a](dopt::Future<void> done) {
    done.get();  // rethrows a failure of the collective
    return 2 * a.item();
  });
  say("async all_reduce, then() * 2: " + std::to_string(static_cast<int>(doubled.get())));

  // Point to point: a ring, rank r sends to r + 1.
  Tensor out = Tensor::full({1}, rank), in = Tensor::empty({1});
  dopt::Future<void> sent = world.send_async(out, (rank + 1) % n);
  world.recv(in, (rank + n - 1) % n);
  sent.get();
  say("ring send/recv, rank 0 got:   " + str(in));

  // Subgroups: pairs of ranks {0,1}, {2,3}, ... (every rank creates them).
  if (n % 2 == 0) {
    dopt::ProcessGroup pair = world.new_subgroups(2).current;
    Tensor p = Tensor::full({1}, rank);
    pair.all_reduce(p);
    say("all_reduce in pairs, rank 0:  " + str(p) + " (ranks 0 + 1)");
  }
  world.barrier();
  say("barrier passed by all " + std::to_string(n) + " ranks");
}

}  // namespace

int main() {
  try {
    dopt::RunOptions options;
    options.simulated_ranks = 4;
    dopt::run_distributed(collectives, options);
  } catch (const dopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
