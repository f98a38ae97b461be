// The quick start of docs/rpc.md, whole (tests/check_docs.py checks the quote).
// A trainer (rank 0) and parameter servers (ps1, ps2, ...); run it with
//   dopt-run --nproc-per-node 2 dopt-snippet-rpc-quick-start
#include <cmath>
#include <cstdio>
#include <string>

#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"
#include "dopt/runtime/launch_env.hpp"
using namespace dopt;

int main() {
  // Every process registers the same functions (they are code), before rpc::init:
  rpc::register_function("make_param", [](std::int64_t n) { return Tensor::full({n}, 0.5); });
  rpc::register_function("add", [](Tensor a, double b) {
    for (std::int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] += static_cast<float>(b);
    return a;
  });

  // Real processes (dopt-run / torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
  auto env = launch_env_from_environment();
  if (!env || env->world_size < 2) {
    std::fprintf(stderr, "run me with a launcher and at least 2 processes: dopt-run --nproc-per-node 2 %s\n",
                 "dopt-snippet-rpc-quick-start");
    return 2;
  }
  Runtime rt;
  rpc::Agent agent = rpc::init(rt, *env, env->rank == 0 ? "trainer" : "ps" + std::to_string(env->rank));
  if (agent.rank() == 0) {
    Tensor t = agent.rpc_sync<Tensor>("ps1", "add", Tensor::zeros({4}), 2.0);        // blocking
    Future<Tensor> f = agent.rpc_async<Tensor>(1, "add", t, 1.0);                    // by rank
    rpc::RRef<Tensor> p = agent.remote<Tensor>("ps1", "make_param", 1024);           // value stays on ps1

    optim::DistributedOptimizer opt(agent, {"SGD", {{"lr", 0.1}}}, {p});
    Tensor grad = Tensor::full({1024}, 1.0);
    rpc::GradContext ctx = agent.new_context();
    ctx.deposit(p, grad);          // gradient for p, kept in ctx on p's owner
    opt.step(ctx);                 // one message per owner; returns when all have applied it

    const float got = f.get().data<float>()[0], param = p.to_here().data<float>()[0];
    std::printf("add: %g, parameter after one step: %g\n", got, param);  // 3 and 0.5 - 0.1 * 1 = 0.4
    if (got != 3.0f || std::abs(param - 0.4f) > 1e-6f) return 1;
  }
  agent.shutdown();                // graceful, on every worker
  return 0;
}
