// GPU benchmarks (issue 8): fused Adam and SGD steps at 10M and 100M
// parameters, the device copy bandwidth, and NCCL all_reduce with one rank per
// GPU when there are several. One JSON object per line on stdout:
//   {"bench":"fused_step","optimizer":"Adam","params":10000000,"tensors":10,
//    "dtype":"float32","steps":20,"ms_per_step":...,"gb_per_s":...}
//   {"bench":"fused_step_streams","optimizer":"Adam","params":...,"streams":1|2,"ms_per_step":...}
//   {"bench":"copy","method":"cudaMemcpyAsync D2D"|"copy kernel","bytes":...,"gb_per_s":...}
//   {"bench":"nccl_all_reduce","ranks":2,"bytes":...,"ms":...,"algbw_gb_per_s":...,"busbw_gb_per_s":...}
//   {"bench":"step_check","optimizer":"Adam","params":...,"steps":25,"checked_elements":...,"mismatches":0,"ok":true}
// step_check: after the timed steps, the first and the last benchmarked tensor
// are read back and compared bit for bit with the CPU optimizer run for the
// same number of steps on the same (uniform) values.
// gb_per_s of a step counts the bytes the step must move (Adam: read param,
// grad, exp_avg, exp_avg_sq, write param, exp_avg, exp_avg_sq = 28 bytes per
// float32 element; SGD with momentum: 20). Without a device it prints
// {"bench":"none","reason":"no CUDA device"} and exits 0.
//
// Usage: dopt_bench_gpu_optim [--sizes 10000000,100000000] [--steps 20] [--tensor-elems 1048576]
//                             [--skip-nccl]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "dopt/actors/simulate.hpp"
#include "dopt/gpu/device.hpp"
#include "dopt/gpu/fused.hpp"
#include "dopt/gpu/nccl.hpp"
#include "dopt/gpu/stream.hpp"
#include "dopt/optim/adam.hpp"
#include "dopt/optim/sgd.hpp"
#include "test_kernels.hpp"

using namespace dopt;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::vector<std::int64_t> parse_sizes(const std::string& s) {
  std::vector<std::int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(static_cast<std::int64_t>(std::atof(item.c_str())));
  return out;
}

// Parameters of `total` elements in tensors of at most `per_tensor`, random-ish values.
std::vector<Tensor> make_params(std::int64_t total, std::int64_t per_tensor, float value) {
  std::vector<Tensor> ps;
  for (std::int64_t done = 0; done < total;) {
    const std::int64_t n = std::min(per_tensor, total - done);
    ps.push_back(Tensor::full({n}, value, DType::float32, Device::cuda(0)));
    done += n;
  }
  return ps;
}

// The CPU optimizer's value of a parameter that starts at 0.5 and gets the
// gradient 1e-3 for `n` steps (what every benchmarked element sees).
float cpu_reference(const optim::OptimizerOptions& options, int n) {
  Tensor p = Tensor::full({1}, 0.5f);
  Tensor g = Tensor::full({1}, 1e-3f);
  std::unique_ptr<optim::Optimizer> opt;
  if (auto* a = dynamic_cast<const optim::AdamOptions*>(&options)) opt = std::make_unique<optim::Adam>(std::vector<Tensor>{p}, *a);
  else opt = std::make_unique<optim::SGD>(std::vector<Tensor>{p}, dynamic_cast<const optim::SGDOptions&>(options));
  p.set_grad(g);
  for (int i = 0; i < n; ++i) opt->step();
  return p.data<float>()[0];
}

void check_step(const char* name, const optim::OptimizerOptions& options, const std::vector<Tensor>& params,
                std::int64_t total, int steps_done) {
  const float want = cpu_reference(options, steps_done);
  std::int64_t checked = 0, bad = 0;
  for (const Tensor* t : {&params.front(), &params.back()}) {
    const Tensor h = t->to(Device::cpu());
    const float* d = h.data<float>();
    for (std::int64_t i = 0; i < h.numel(); ++i) {
      bad += std::memcmp(&d[i], &want, sizeof(float)) != 0;
      ++checked;
    }
  }
  std::printf("{\"bench\":\"step_check\",\"optimizer\":\"%s\",\"params\":%lld,\"steps\":%d,"
              "\"checked_elements\":%lld,\"mismatches\":%lld,\"cpu_value\":%.9g,\"ok\":%s}\n",
              name, static_cast<long long>(total), steps_done, static_cast<long long>(checked),
              static_cast<long long>(bad), static_cast<double>(want), bad == 0 ? "true" : "false");
  std::fflush(stdout);
}

void bench_step(const char* name, const optim::OptimizerOptions& options, std::int64_t total, std::int64_t per_tensor,
                int steps, double bytes_per_elem) {
  std::vector<Tensor> params = make_params(total, per_tensor, 0.5f);
  std::vector<Tensor> grads = make_params(total, per_tensor, 1e-3f);
  std::vector<ParamState> states(params.size());
  std::vector<ParamState*> sp;
  for (auto& s : states) sp.push_back(&s);
  gpu::Stream& stream = gpu::rank_stream(0, 0);
  for (int i = 0; i < 5; ++i) (void)gpu::fused_step_async(options, params, grads, sp, stream);  // warm up, state created
  stream.synchronize();
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) (void)gpu::fused_step_async(options, params, grads, sp, stream);
  stream.synchronize();
  const double ms = ms_since(t0) / steps;
  const double gbps = bytes_per_elem * static_cast<double>(total) / (ms * 1e-3) / 1e9;
  std::printf(
      "{\"bench\":\"fused_step\",\"optimizer\":\"%s\",\"params\":%lld,\"tensors\":%zu,\"dtype\":\"float32\","
      "\"steps\":%d,\"ms_per_step\":%.4f,\"gb_per_s\":%.1f}\n",
      name, static_cast<long long>(total), params.size(), steps, ms, gbps);
  std::fflush(stdout);
  check_step(name, options, params, total, 5 + steps);
}

// Two actors, each with its own stream and half of the parameters, stepping
// at the same time (their kernels may overlap on the device), against one
// stream doing both halves: the per-actor stream contract in numbers.
void bench_two_streams(std::int64_t total, std::int64_t per_tensor, int steps) {
  const optim::AdamOptions options(1e-3);
  std::vector<Tensor> params = make_params(total, per_tensor, 0.5f);
  std::vector<Tensor> grads = make_params(total, per_tensor, 1e-3f);
  std::vector<ParamState> states(params.size());
  const std::size_t half = params.size() / 2;
  auto part = [&](std::size_t b, std::size_t e, std::vector<Tensor>& ps, std::vector<Tensor>& gs,
                  std::vector<ParamState*>& ss) {
    for (std::size_t i = b; i < e; ++i) {
      ps.push_back(params[i]);
      gs.push_back(grads[i]);
      ss.push_back(&states[i]);
    }
  };
  std::vector<Tensor> pa, ga, pb, gb;
  std::vector<ParamState*> sa, sb;
  part(0, half, pa, ga, sa);
  part(half, params.size(), pb, gb, sb);
  auto a = gpu::make_stream(0), b = gpu::make_stream(0);
  for (int mode = 0; mode < 2; ++mode) {
    gpu::Stream& second = mode == 0 ? *a : *b;  // mode 0: one stream for both halves
    for (int i = 0; i < 3; ++i) {
      (void)gpu::fused_step_async(options, pa, ga, sa, *a);
      (void)gpu::fused_step_async(options, pb, gb, sb, second);
    }
    a->synchronize();
    second.synchronize();
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) {
      (void)gpu::fused_step_async(options, pa, ga, sa, *a);
      (void)gpu::fused_step_async(options, pb, gb, sb, second);
    }
    a->synchronize();
    second.synchronize();
    std::printf("{\"bench\":\"fused_step_streams\",\"optimizer\":\"Adam\",\"params\":%lld,\"streams\":%d,"
                "\"ms_per_step\":%.4f}\n",
                static_cast<long long>(total), mode + 1, ms_since(t0) / steps);
    std::fflush(stdout);
  }
}

void bench_copy(std::int64_t bytes, int reps) {
  const std::int64_t n = bytes / 4;
  Tensor a = Tensor::zeros({n}, DType::float32, Device::cuda(0));
  Tensor b = Tensor::zeros({n}, DType::float32, Device::cuda(0));
  gpu::Stream& stream = gpu::rank_stream(0, 0);
  for (int method = 0; method < 2; ++method) {
    auto once = [&] {
      if (method == 0) stream.copy_async(b, a);
      else gpu::detail::launch_copy16(stream.native(), b.data_ptr(), a.data_ptr(), bytes / 16);
    };
    once();
    stream.synchronize();
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) once();
    stream.synchronize();
    const double ms = ms_since(t0) / reps;
    // A copy reads and writes every byte.
    std::printf("{\"bench\":\"copy\",\"method\":\"%s\",\"bytes\":%lld,\"ms\":%.4f,\"gb_per_s\":%.1f}\n",
                method == 0 ? "cudaMemcpyAsync D2D" : "copy kernel", static_cast<long long>(bytes), ms,
                2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
    std::fflush(stdout);
  }
}

void bench_nccl(int ranks, std::int64_t bytes, int iters) {
  std::mutex m;
  double best_ms = 0;
  simulate(ranks, [&](RankContext& ctx) {
    const Device dev = Device::cuda(ctx.rank());
    Tensor t = Tensor::full({bytes / 4}, 1.0, DType::float32).to(dev);
    ctx.world().all_reduce(t);  // creates the communicator, warms up
    ctx.world().all_reduce(t);
    ctx.world().barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) ctx.world().all_reduce(t);
    const double ms = ms_since(t0) / iters;
    if (ctx.rank() == 0) {
      std::lock_guard<std::mutex> l(m);
      best_ms = ms;
    }
  });
  const double alg = static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
  std::printf(
      "{\"bench\":\"nccl_all_reduce\",\"ranks\":%d,\"bytes\":%lld,\"ms\":%.4f,\"algbw_gb_per_s\":%.1f,"
      "\"busbw_gb_per_s\":%.1f}\n",
      ranks, static_cast<long long>(bytes), best_ms, alg, alg * 2.0 * (ranks - 1) / ranks);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> sizes{10'000'000, 100'000'000};
  int steps = 20;
  std::int64_t per_tensor = 1 << 20;
  bool nccl = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--sizes") sizes = parse_sizes(next());
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--tensor-elems") per_tensor = std::atoll(next().c_str());
    else if (a == "--skip-nccl") nccl = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (!gpu::init()) {
    std::printf("{\"bench\":\"none\",\"reason\":\"no CUDA device\"}\n");
    return 0;
  }
  std::printf("{\"bench\":\"info\",\"devices\":%d,\"nccl_version\":%d}\n", gpu::device_count(), gpu::nccl_version());
  for (std::int64_t n : sizes) {
    bench_step("Adam", optim::AdamOptions(1e-3), n, per_tensor, steps, 28.0);
    bench_step("SGD", optim::SGDOptions(1e-2).momentum(0.9), n, per_tensor, steps, 20.0);
    gpu::empty_cache();
  }
  bench_two_streams(sizes.front(), per_tensor, steps);
  gpu::empty_cache();
  bench_copy(1LL << 30, 10);
  gpu::empty_cache();
  const int devs = gpu::device_count();
  if (nccl && devs > 1) {
    for (std::int64_t bytes : {64LL << 20, 256LL << 20}) bench_nccl(devs, bytes, 10);
  } else {
    std::printf("{\"bench\":\"nccl_all_reduce\",\"skipped\":\"%s\"}\n",
                nccl ? "one GPU: needs one rank per GPU on two or more" : "--skip-nccl");
  }
  return 0;
}
