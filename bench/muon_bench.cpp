// dopt_bench_muon: Muon's step on a transformer-shaped set of matrices,
// against Adam's step on the same matrices (one rank), and ZeRO-Muon over
// simulated ranks (one thread per rank) against single-rank Muon, with the
// element-count and the Newton-Schulz-cost partition.
//
//   dopt_bench_muon [--d-model 768] [--layers 7] [--ranks 2,4] [--steps 2] [--warmup 1]
//                   [--dtype float32] [--ns-dtype float32] [--skip-adam] [--skip-muon]
//                   [--partition-only]
//
// Each layer holds the four matrices of a transformer block: the attention
// projections [d, 3d] and [d, d] and the MLP's [d, 4d] and [4d, d] (7.1M
// parameters per layer at d = 768; 7 layers: 49.6M). Gradients are fixed
// (set once). W warm-up steps (the first creates the state), then S timed
// steps; with ZeRO each step starts after a barrier and its time is the
// slowest rank's. Prints one JSON line per measurement:
//   {"what": "adam"|"muon"|"zero_muon", "world_size", "partition",
//    "step_ms" (median wall time), "min_ms", "cpu_ms" (median CPU time of
//    the stepping thread; for ZeRO "cpu_ms_slowest_rank", the rank that
//    worked longest: the step time when every rank has a core to itself),
//    "imbalance" (the largest rank's Newton-Schulz cost over the mean;
//    "element_imbalance" the same for elements), "params", ...}
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dopt/actors/simulate.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/muon.hpp"
#include "dopt/distributed/zero.hpp"

#include "bench_util.hpp"

namespace {

using namespace dopt;
using namespace dopt::optim;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// CPU time of the calling thread, ms: the work a step did, whatever else
// runs on the machine.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

std::vector<Shape> transformer_shapes(std::int64_t d, int layers) {
  std::vector<Shape> s;
  for (int l = 0; l < layers; ++l) {
    s.push_back({d, 3 * d});
    s.push_back({d, d});
    s.push_back({d, 4 * d});
    s.push_back({4 * d, d});
  }
  return s;
}

std::vector<Tensor> make_params(const std::vector<Shape>& shapes, DType dt) {
  std::vector<Tensor> ps;
  std::uint64_t x = 88172645463325252ull;
  for (const auto& s : shapes) {
    Tensor p = Tensor::empty(s, DType::float32);
    Tensor g = Tensor::empty(s, DType::float32);
    float* pd = p.data<float>();
    float* gd = g.data<float>();
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      pd[i] = static_cast<float>(static_cast<double>(x >> 40) / 16777216.0 - 0.5) * 0.02f;
      gd[i] = static_cast<float>(static_cast<double>(x & 0xFFFFFF) / 16777216.0 - 0.5);
    }
    p = p.to(dt);
    p.set_grad(g.to(dt));
    ps.push_back(p);
  }
  return ps;
}

std::int64_t total_numel(const std::vector<Shape>& shapes) {
  std::int64_t n = 0;
  for (const auto& s : shapes) n += shape_numel(s);
  return n;
}

// Wall and thread-CPU ms of each timed step.
template <class Opt>
std::pair<std::vector<double>, std::vector<double>> time_local(Opt& opt, int warmup, int steps) {
  for (int i = 0; i < warmup; ++i) opt.step();
  std::vector<double> t, cpu;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_ms();
    opt.step();
    cpu.push_back(thread_cpu_ms() - c0);
    t.push_back(ms_since(t0));
  }
  return {t, cpu};
}

std::vector<int> parse_ranks(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt Muon step benchmark"};
  std::int64_t d = 768;
  int layers = 7, steps = 2, warmup = 1;
  std::string ranks = "2,4", dtype = "float32", ns_dtype = "float32";
  bool skip_adam = false, skip_muon = false, partition_only = false;
  app.add_option("--d-model", d, "model width");
  app.add_option("--layers", layers, "transformer blocks");
  app.add_option("--ranks", ranks, "world sizes for ZeRO-Muon, comma-separated (empty: none)");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "warm-up steps (the first creates the state)");
  app.add_option("--dtype", dtype, "parameter dtype: float32 or float64");
  app.add_option("--ns-dtype", ns_dtype, "Muon's ns_dtype: float64, float32 or bfloat16");
  app.add_flag("--skip-adam", skip_adam, "do not time Adam");
  app.add_flag("--skip-muon", skip_muon, "do not time single-rank Muon (ratios to it print as -1)");
  app.add_flag("--partition-only", partition_only,
               "only build ZeRO at each world size and print the partitions' imbalance (no steps)");
  CLI11_PARSE(app, argc, argv);
  const DType dt = dtype == "float64" ? DType::float64 : DType::float32;
  const auto shapes = transformer_shapes(d, layers);
  const std::int64_t n = total_numel(shapes);
  const MuonOptions mo = MuonOptions(0.02).ns_dtype(ns_dtype);
  auto common = [&](const char* what) {
    std::ostringstream os;
    os << "\"what\": \"" << what << "\", \"params\": " << n << ", \"matrices\": " << shapes.size()
       << ", \"d_model\": " << d << ", \"layers\": " << layers << ", \"dtype\": \"" << dtype
       << "\", \"ns_dtype\": \"" << ns_dtype << "\", \"steps\": " << steps << ", \"warmup\": " << warmup;
    return os.str();
  };

  double adam_cpu_ms = -1;
  if (partition_only) skip_adam = skip_muon = true, steps = 0, warmup = 0;
  if (!skip_adam) {
    auto p = make_params(shapes, dt);
    Adam adam(p, AdamOptions(1e-3));
    const auto [t, cpu] = time_local(adam, warmup, steps);
    adam_cpu_ms = bench::median(cpu);
    std::printf("{%s, \"world_size\": 1, \"step_ms\": %.1f, \"min_ms\": %.1f, \"cpu_ms\": %.1f}\n",
                common("adam").c_str(), bench::median(t), *std::min_element(t.begin(), t.end()), adam_cpu_ms);
    std::fflush(stdout);
  }
  double muon_ms = -1, muon_cpu_ms = -1;
  if (!skip_muon) {
    auto p = make_params(shapes, dt);
    Muon muon(p, mo);
    const auto [t, cpu] = time_local(muon, warmup, steps);
    muon_ms = bench::median(t);
    muon_cpu_ms = bench::median(cpu);
    std::printf("{%s, \"world_size\": 1, \"step_ms\": %.1f, \"min_ms\": %.1f, \"cpu_ms\": %.1f, "
                "\"cpu_vs_adam\": %.1f}\n",
                common("muon").c_str(), muon_ms, *std::min_element(t.begin(), t.end()), muon_cpu_ms,
                adam_cpu_ms > 0 ? muon_cpu_ms / adam_cpu_ms : -1.0);
    std::fflush(stdout);
  }
  for (int world : parse_ranks(ranks)) {
    for (auto weight : {ZeroPartitionWeight::element_count, ZeroPartitionWeight::step_cost}) {
      std::vector<double> step_ms, step_cpu_ms;
      double imbalance = 0, imbalance_elements = 0;
      std::mutex m;
      simulate(world, [&](RankContext& ctx) {
        std::vector<Tensor> p;
        if (partition_only)
          for (const auto& sh : shapes) p.push_back(Tensor::zeros(sh, dt));
        else p = make_params(shapes, dt);
        ZeroOptions zo;
        zo.process_group = ctx.world();
        zo.partition_weight = weight;
        ZeroRedundancyOptimizer zero(p, mo, zo);
        for (int i = 0; i < warmup; ++i) zero.step();
        std::vector<double> mine, mine_cpu;
        for (int i = 0; i < steps; ++i) {
          ctx.world().barrier();
          const auto t0 = Clock::now();
          const double c0 = thread_cpu_ms();
          zero.step();
          mine_cpu.push_back(thread_cpu_ms() - c0);
          mine.push_back(ms_since(t0));
        }
        ProcessGroup world_group = ctx.world();
        const auto slowest = steps > 0 ? bench::slowest(world_group, mine) : mine;
        const auto slowest_cpu = steps > 0 ? bench::slowest(world_group, mine_cpu) : mine_cpu;
        if (ctx.rank() == 0) {
          // Load of each rank: its matrices' Newton-Schulz cost (and elements).
          const auto owners = zero.param_owners();
          std::vector<double> cost(static_cast<std::size_t>(world), 0.0), elems(static_cast<std::size_t>(world), 0.0);
          double total_cost = 0, total_elems = 0;
          for (std::size_t i = 0; i < shapes.size(); ++i) {
            const double c = mo.step_cost(shapes[i]);
            cost[static_cast<std::size_t>(owners[i])] += c;
            elems[static_cast<std::size_t>(owners[i])] += static_cast<double>(shape_numel(shapes[i]));
            total_cost += c;
            total_elems += static_cast<double>(shape_numel(shapes[i]));
          }
          std::lock_guard<std::mutex> lock(m);
          step_ms = slowest;
          step_cpu_ms = slowest_cpu;
          imbalance = *std::max_element(cost.begin(), cost.end()) / (total_cost / world);
          imbalance_elements = *std::max_element(elems.begin(), elems.end()) / (total_elems / world);
        }
      });
      if (partition_only) {
        std::printf("{\"what\": \"partition\", \"params\": %lld, \"matrices\": %zu, \"world_size\": %d, "
                    "\"partition\": \"%s\", \"imbalance\": %.3f, \"element_imbalance\": %.3f}\n",
                    static_cast<long long>(n), shapes.size(), world,
                    weight == ZeroPartitionWeight::step_cost ? "step_cost" : "element_count", imbalance,
                    imbalance_elements);
        continue;
      }
      const double med = bench::median(step_ms), cpu = bench::median(step_cpu_ms);
      std::printf(
          "{%s, \"world_size\": %d, \"partition\": \"%s\", \"step_ms\": %.1f, \"min_ms\": %.1f, "
          "\"vs_single_rank_muon\": %.3f, \"cpu_ms_slowest_rank\": %.1f, \"cpu_vs_single_rank_muon\": %.3f, "
          "\"imbalance\": %.3f, \"element_imbalance\": %.3f}\n",
          common("zero_muon").c_str(), world, weight == ZeroPartitionWeight::step_cost ? "step_cost" : "element_count",
          med, *std::min_element(step_ms.begin(), step_ms.end()), muon_ms > 0 ? med / muon_ms : -1.0, cpu,
          muon_cpu_ms > 0 ? cpu / muon_cpu_ms : -1.0, imbalance,
          imbalance_elements);
      std::fflush(stdout);
    }
  }
  return 0;
}
