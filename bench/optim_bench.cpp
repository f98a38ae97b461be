// Optimizer step throughput, one process.
//
//   OptimStep/<Class>/<numel>/<num_tensors>              one thread
//   OptimStepThreads/<Class>/<numel>/<num_tensors>/<threads>  multi-tensor path
//   ClipGradNorm/<numel>/<num_tensors>/<threads>/<clip|noclip> clip_grad_norm
//
// bytes_per_second counts the minimal bytes an exact step must move per
// element (float32): SGD with momentum, Adagrad, RMSprop 20 B (read p, g, one
// state; write p, state); Adam, AdamW, Adamax, Adadelta, Rprop 28 B (read p, g,
// two states; write p, two states).
//
//   dopt_bench_optim --benchmark_format=json --benchmark_filter='OptimStep/Adam/'
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "dopt/optim/clip_grad.hpp"
#include "dopt/optim/registry.hpp"

namespace {

struct Case {
  const char* cls;
  dopt::Hyperparams hyper;
  int bytes_per_elem;
};

std::vector<Case> cases() {
  return {
      {"SGD", {{"lr", 0.01}, {"momentum", 0.9}}, 20},
      {"Adam", {{"lr", 1e-3}}, 28},
      {"AdamW", {{"lr", 1e-3}, {"weight_decay", 1e-2}}, 28},
      {"Adagrad", {{"lr", 1e-2}}, 20},
      {"RMSprop", {{"lr", 1e-2}}, 20},
      {"Adamax", {{"lr", 2e-3}}, 28},
      {"Adadelta", {{"lr", 1.0}}, 28},
      {"Rprop", {{"lr", 1e-2}}, 28},
      {"NAdam", {{"lr", 2e-3}}, 28},
      {"RAdam", {{"lr", 1e-3}}, 28},
  };
}

std::vector<dopt::Tensor> make_params(std::int64_t numel, std::int64_t tensors) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::normal_distribution<float> nd(0.f, 1e-3f);
  std::vector<dopt::Tensor> params;
  const std::int64_t base = numel / tensors, rem = numel % tensors;
  for (std::int64_t i = 0; i < tensors; ++i) {
    const std::int64_t n = base + (i < rem ? 1 : 0);
    dopt::Tensor p = dopt::Tensor::empty({n});
    dopt::Tensor g = dopt::Tensor::empty({n});
    float* pp = p.data<float>();
    float* gg = g.data<float>();
    for (std::int64_t k = 0; k < n; ++k) {
      pp[k] = u(rng);
      gg[k] = nd(rng);
    }
    p.set_grad(g);
    params.push_back(p);
  }
  return params;
}

void run_step(benchmark::State& state, const Case& c, std::int64_t numel, std::int64_t tensors, int threads) {
  auto params = make_params(numel, tensors);
  auto opt = dopt::optim::make_optimizer(dopt::optim::OptimizerSpec{c.cls, c.hyper},
                                         {dopt::optim::OptimizerParamGroup(params)});
  opt->set_num_threads(threads);
  opt->step();  // creates the state outside the timed region
  for (auto _ : state) {
    opt->step();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * numel * c.bytes_per_elem);
  state.counters["numel"] = static_cast<double>(numel);
  state.counters["tensors"] = static_cast<double>(tensors);
  state.counters["threads"] = threads;
}

/// clip_grad_norm over `tensors` gradients of `numel` elements in all, with
/// `threads`; max_norm 1 clips (the coefficient is < 1: a norm pass and a
/// scaling pass), max_norm 1e30 does not (the coefficient is 1: dopt skips
/// the multiplication by 1, which changes no bit). The gradients keep their
/// values: each iteration restores them first (outside the timed region).
void run_clip(benchmark::State& state, std::int64_t numel, std::int64_t tensors, int threads, double max_norm) {
  auto params = make_params(numel, tensors);
  std::vector<dopt::Tensor> saved;
  for (const auto& p : params) saved.push_back(p.grad().clone());
  dopt::optim::ClipGradNormOptions o;
  o.num_threads = threads;
  double total = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].grad().copy_(saved[i]);
    state.ResumeTiming();
    total = dopt::optim::clip_grad_norm(params, max_norm, o);
    benchmark::ClobberMemory();
  }
  // norm pass reads 4 B per element; clipping also reads and writes them (8 B)
  state.SetBytesProcessed(state.iterations() * numel * (max_norm < 1e29 ? 12 : 4));
  state.counters["total_norm"] = total;
  state.counters["threads"] = threads;
}

int register_all() {
  for (std::int64_t tensors : {1, 100})
    for (int threads : {1, 2})
      for (double max_norm : {1.0, 1e30}) {
        const std::int64_t n = 10000000;
        const std::string name = std::string("ClipGradNorm/") + std::to_string(n) + "/" + std::to_string(tensors) +
                                 "/" + std::to_string(threads) + (max_norm < 1e29 ? "/clip" : "/noclip");
        benchmark::RegisterBenchmark(name.c_str(), [n, tensors, threads, max_norm](benchmark::State& s) {
          run_clip(s, n, tensors, threads, max_norm);
        })->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
      }
  const std::vector<std::int64_t> sizes = {1000000, 10000000, 100000000};
  const std::vector<std::int64_t> splits = {1, 1000};
  for (const auto& c : cases()) {
    for (auto n : sizes)
      for (auto k : splits) {
        const std::string name = std::string("OptimStep/") + c.cls + "/" + std::to_string(n) + "/" + std::to_string(k);
        benchmark::RegisterBenchmark(name.c_str(), [c, n, k](benchmark::State& s) { run_step(s, c, n, k, 1); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->MinTime(n >= 100000000 ? 2.0 : 0.5);
      }
    for (auto n : sizes)
      for (int threads : {2}) {
        const std::int64_t k = 1000;
        const std::string name = std::string("OptimStepThreads/") + c.cls + "/" + std::to_string(n) + "/" +
                                 std::to_string(k) + "/" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [c, n, k, threads](benchmark::State& s) { run_step(s, c, n, k, threads); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            ->MinTime(n >= 100000000 ? 2.0 : 0.5);
      }
  }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
