// A parameter server over dopt::rpc: two owners ("ps0", "ps1") hold a linear
// model's weight W [out, in] and bias b [out]; three trainers ("trainer2",
// "trainer3", "trainer4") each fetch the model, run forward and a
// hand-written backward on their own data, deposit the gradients into a
// fresh gradient context and step their DistributedOptimizer, all at the
// same time on the same parameters. The owners apply one step at a time.
//
//   dopt-example-parameter-server                         # 5 simulated workers in this process
//   dopt-run --nproc-per-node 5 dopt-example-parameter-server
//   options: --steps S (per trainer) --optim sgd|adam --lr LR --check-loss-falls --quiet
//
// Each trainer prints its loss every 10 steps and its final loss; with
// --check-loss-falls the program fails unless every trainer's final loss is
// below a tenth of its first.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "dopt/actors/rpc.hpp"
#include "dopt/distributed/distributed_optimizer.hpp"

using dopt::Tensor;
using dopt::rpc::Agent;
using dopt::rpc::RRef;

namespace {

constexpr int kIn = 16;
constexpr int kOut = 4;
constexpr int kBatch = 32;

// The owners' parameters, by (owner rank, name): every trainer's RRef to "W"
// names this one tensor (simulated workers share the process, hence the rank).
std::mutex g_store_mutex;
std::map<std::pair<int, std::string>, Tensor> g_store;

Tensor stored_param(Agent& a, const std::string& name) {
  std::lock_guard<std::mutex> lock(g_store_mutex);
  auto& t = g_store[{a.rank(), name}];
  if (!t.defined()) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 0.1f);
    std::vector<float> v(name == "W" ? kIn * kOut : kOut);
    for (auto& x : v) x = nd(rng);
    t = name == "W" ? Tensor::from_vector(v, {kOut, kIn}) : Tensor::from_vector(v, {kOut});
  }
  return t;
}

// The task: y = W* x + b* + noise, the same W*, b* for every trainer, data of its own.
struct Batch {
  std::vector<float> x, y;
};
Batch make_batch(std::mt19937& rng) {
  static const auto truth = [] {
    std::mt19937 r(1234);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> w(kIn * kOut), b(kOut);
    for (auto& v : w) v = nd(r);
    for (auto& v : b) v = nd(r);
    return std::make_pair(w, b);
  }();
  std::normal_distribution<float> nd(0.f, 1.f);
  Batch bt{std::vector<float>(kBatch * kIn), std::vector<float>(kBatch * kOut)};
  for (auto& v : bt.x) v = nd(rng);
  for (int i = 0; i < kBatch; ++i)
    for (int o = 0; o < kOut; ++o) {
      float s = truth.second[o] + 0.01f * nd(rng);
      for (int j = 0; j < kIn; ++j) s += truth.first[o * kIn + j] * bt.x[i * kIn + j];
      bt.y[i * kOut + o] = s;
    }
  return bt;
}

/// Mean squared error and its gradients (hand-written backward).
double forward_backward(const Tensor& w, const Tensor& b, const Batch& bt, Tensor& gw, Tensor& gb) {
  const float* W = w.data<float>();
  const float* B = b.data<float>();
  gw = Tensor::zeros({kOut, kIn});
  gb = Tensor::zeros({kOut});
  float* GW = gw.data<float>();
  float* GB = gb.data<float>();
  double loss = 0;
  const float scale = 2.f / (kBatch * kOut);
  for (int i = 0; i < kBatch; ++i)
    for (int o = 0; o < kOut; ++o) {
      float pred = B[o];
      for (int j = 0; j < kIn; ++j) pred += W[o * kIn + j] * bt.x[i * kIn + j];
      const float err = pred - bt.y[i * kOut + o];
      loss += double(err) * err / (kBatch * kOut);
      GB[o] += scale * err;
      for (int j = 0; j < kIn; ++j) GW[o * kIn + j] += scale * err * bt.x[i * kIn + j];
    }
  return loss;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt parameter-server example (DistributedOptimizer over dopt::rpc)"};
  int steps = 100;
  std::string optim = "sgd";
  double lr = -1;
  bool check = false, quiet = false;
  app.add_option("--steps", steps, "steps per trainer")->check(CLI::PositiveNumber);
  app.add_option("--optim", optim, "sgd or adam")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--lr", lr, "learning rate (default: sgd 0.05 with momentum 0.9, adam 0.05)");
  app.add_flag("--check-loss-falls", check, "fail unless every trainer's loss falls below a tenth");
  app.add_flag("--quiet", quiet, "only the final losses");
  CLI11_PARSE(app, argc, argv);
  if (lr < 0) lr = 0.05;
  const dopt::optim::OptimizerSpec spec =
      optim == "sgd" ? dopt::optim::OptimizerSpec{"SGD", {{"lr", lr}, {"momentum", 0.9}}}
                     : dopt::optim::OptimizerSpec{"Adam", {{"lr", lr}}};

  dopt::rpc::register_function("ps.param", [](Agent& a, const std::string& name) { return stored_param(a, name); });

  std::mutex out_mutex;
  bool all_fell = true;
  try {
    dopt::rpc::run(
        [&](Agent& a) {
          if (a.world_size() != 5) throw dopt::ValueError("parameter_server", "needs 5 workers (2 owners, 3 trainers)");
          if (a.rank() < 2) return;  // the owners serve
          // Every trainer gets its own RRefs to the owners' one W and one b.
          RRef<Tensor> w = a.remote<Tensor>("ps0", "ps.param", "W");
          RRef<Tensor> b = a.remote<Tensor>("ps1", "ps.param", "b");
          dopt::optim::DistributedOptimizer opt(a, spec, {w, b});
          std::mt19937 rng(100 + a.rank());
          double first = 0, last = 0;
          for (int s = 0; s < steps; ++s) {
            const Batch bt = make_batch(rng);
            Tensor gw, gb;
            last = forward_backward(w.to_here(), b.to_here(), bt, gw, gb);  // forward on fetched parameters
            if (s == 0) first = last;
            dopt::rpc::GradContext ctx = a.new_context();
            (void)ctx.deposit_all({{w, gw}, {b, gb}});
            opt.step(ctx);
            if (!quiet && s % 10 == 0) {
              std::lock_guard<std::mutex> lock(out_mutex);
              std::printf("%s step %d loss %.6f\n", a.name().c_str(), s, last);
              std::fflush(stdout);
            }
          }
          std::lock_guard<std::mutex> lock(out_mutex);
          std::printf("%s final loss %.6f (first %.6f)\n", a.name().c_str(), last, first);
          std::fflush(stdout);
          if (!(last < 0.1 * first)) all_fell = false;
        },
        {.simulated_workers = 5,
         .names = [](int r) { return r < 2 ? "ps" + std::to_string(r) : "trainer" + std::to_string(r); },
         .rpc = {}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parameter_server: %s\n", e.what());
    return 1;
  }
  if (check && !all_fell) {
    std::fprintf(stderr, "parameter_server: a trainer's loss did not fall below a tenth of its first\n");
    return 1;
  }
  return 0;
}
