// dopt_bench_sim exchange: the network model's exchange_bandwidth, measured
// apart from any collective (bench/compare_network_model.py).
//
//   dopt_bench_sim exchange [--iters 5000] [--cores 0,1] [--bytes S ...]
//
// Two processes, each pinned to one of two cores, run the pattern of the
// shared-memory plane's one-round all_reduce for two members on a float32
// tensor of S bytes (the plane's code is not used): each copies its tensor
// into its own buffer; after a barrier each adds both buffers into its
// tensor; a barrier. The same with each process adding its own buffer twice
// is the baseline. The difference is what reading S bytes another core has
// just written costs past reading them from one's own cache. Both patterns
// are timed in turn, five times over the sizes (medians).
//
// Prints one JSON line per size: {"benchmark": "sim_exchange", "bytes",
// "local_us", "exchange_us", "extra_us", "gbs": S / extra}, then a summary:
// {"benchmark": "sim_exchange", "exchange_gbs": the median of the sizes'
// rates (0 when no size showed an extra time)}.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

namespace {

struct Control {
  alignas(64) std::atomic<std::int64_t> arrived[2]{};
  alignas(64) std::atomic<std::int64_t> pad{0};
};

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::sched_setaffinity(0, sizeof set, &set);
}

/// Both processes arrive (polling: the plane's waiters poll while each member has a core).
void barrier(Control& c, int me, std::int64_t& generation) {
  ++generation;
  c.arrived[me].store(generation, std::memory_order_release);
  while (c.arrived[1 - me].load(std::memory_order_acquire) < generation) {
  }
}

/// The median time of one one-round exchange of `bytes` between the two
/// processes (`remote`: each adds the other's buffer; else its own twice).
double time_pattern(Control& c, float* const buf[2], int me, std::size_t bytes, bool remote, int iters,
                    std::int64_t& generation) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> tensor(n, 1.0f + static_cast<float>(me));
  float* const own = buf[me];
  const float* const other = remote ? buf[1 - me] : buf[me];
  std::vector<double> took;
  for (int it = 0; it < iters + iters / 10 + 1; ++it) {
    barrier(c, me, generation);
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(own, tensor.data(), bytes);
    barrier(c, me, generation);
    const float* __restrict a = own;
    const float* __restrict b = other;
    float* __restrict t = tensor.data();
    for (std::size_t i = 0; i < n; ++i) t[i] = (a[i] + b[i]) * 0.5f;
    barrier(c, me, generation);
    const auto t1 = std::chrono::steady_clock::now();
    if (it > iters / 10) took.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(took.begin(), took.end());
  return took[took.size() / 2];
}

}  // namespace

int sim_exchange_main(int argc, char** argv) {
  CLI::App app{"dopt_bench_sim exchange: reading what another core just wrote (the network model's exchange terms)"};
  int iters = 5000;
  std::vector<int> cores{0, 1};
  std::vector<std::size_t> sizes{4096, 8192, 16384, 32768};
  app.add_option("--iters", iters, "exchanges timed per size and pattern")->check(CLI::Range(50, 1000000));
  app.add_option("--cores", cores, "the two cores")->expected(2);
  app.add_option("--bytes", sizes, "tensor sizes (bytes, multiples of 4; default: the one-round path's)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::size_t largest = 0;
  for (std::size_t s : sizes) {
    if (s < 4 || s % 4 != 0) {
      std::fprintf(stderr, "dopt_bench_sim exchange: --bytes %zu: sizes must be positive multiples of 4\n", s);
      return 2;
    }
    largest = std::max(largest, s);
  }
  const std::size_t page = 4096, region = page + 2 * ((largest + page - 1) / page * page);
  void* mem = ::mmap(nullptr, region, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("dopt_bench_sim exchange: mmap");
    return 1;
  }
  auto* control = new (mem) Control();
  float* const buf[2] = {reinterpret_cast<float*>(static_cast<char*>(mem) + page),
                         reinterpret_cast<float*>(static_cast<char*>(mem) + page + (region - page) / 2)};
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("dopt_bench_sim exchange: fork");
    return 1;
  }
  const int me = child == 0 ? 1 : 0;
  pin(cores[static_cast<std::size_t>(me)]);
  std::int64_t generation = 0;
  struct Row {
    std::size_t bytes;
    double local_us, exchange_us;
  };
  std::vector<Row> rows;
  // Five passes over the sizes, each timing a fifth of the iterations of
  // both patterns in turn; a size's figures are the medians of its passes
  // (a pause of one core by the machine's host then spoils one pass only).
  constexpr int kPasses = 5;
  std::vector<std::vector<double>> local(sizes.size()), exchange(sizes.size());
  for (int pass = 0; pass < kPasses; ++pass)
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      local[i].push_back(time_pattern(*control, buf, me, sizes[i], false, iters / kPasses, generation));
      exchange[i].push_back(time_pattern(*control, buf, me, sizes[i], true, iters / kPasses, generation));
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (std::size_t i = 0; i < sizes.size(); ++i) rows.push_back({sizes[i], median(local[i]), median(exchange[i])});
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::vector<double> rates;
  for (const Row& r : rows) {
    const double extra = r.exchange_us - r.local_us;
    const double gbs = extra > 0 ? static_cast<double>(r.bytes) / extra / 1e3 : 0;
    std::printf(
        "{\"benchmark\": \"sim_exchange\", \"bytes\": %zu, \"local_us\": %.3f, \"exchange_us\": %.3f, "
        "\"extra_us\": %.3f, \"gbs\": %.3f}\n",
        r.bytes, r.local_us, r.exchange_us, extra, gbs);
    if (gbs > 0) rates.push_back(gbs);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("{\"benchmark\": \"sim_exchange\", \"exchange_gbs\": %.3f, \"iters\": %d, \"cores\": [%d, %d]}\n",
              rates.empty() ? 0.0 : rates[rates.size() / 2], iters, cores[0], cores[1]);
  ::munmap(mem, region);
  return 0;
}
