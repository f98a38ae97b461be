// dopt_bench_auth: what authentication costs (docs/performance.md).
//
//   dopt_bench_auth handshake [--iters N]
//       dopt's handshake over loopback, N times with a secret (HMAC-SHA256
//       challenge-response both ways) and N times without: one JSON line each
//       {"what": "handshake", "secret", "iters", "median_us", "p90_us"}.
//   dopt-run --nproc-per-node 2 dopt_bench_auth job [--iters N]
//       (or any launcher) one rank each: the time init_process_group takes
//       (rendezvous, every handshake, the data plane), then N all_reduce of
//       4 KiB; rank 0 prints {"what": "job", "secret", "transport",
//       "init_ms", "iters", "median_us", "min_us"} (init_ms and every call's
//       time the largest over the ranks). "secret": whether the job has one
//       of its own (without, the ranks' ports take the session key).
// The handshake runs once per connection; a call after it touches none of
// it, which the job mode shows by timing calls with and without a secret.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "dopt/runtime/settings.hpp"
#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/internal/handshake.hpp"
#include "dopt/runtime/launch_env.hpp"
#include "dopt/runtime/tensor.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * double(v.size() - 1))];
}

void handshakes(int iters) {
  for (const bool secret : {false, true}) {
    dopt::net::Credentials c;
    c.job_id = "bench";
    c.secret = secret ? std::string(64, 'k') : std::string();
    c.rank = 0;
    c.world_size = 2;
    dopt::net::AuthListener::Options o;
    o.purpose = dopt::net::Purpose::control;
    o.credentials = c;
    o.on_ready = [](int fd, const dopt::net::PeerHello&) { ::close(fd); };
    dopt::net::AuthListener listener(o);
    c.rank = 1;
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = Clock::now();
      dopt::net::RetryLater retry;
      auto fd = dopt::net::connect_authenticated("127.0.0.1", listener.port(), dopt::net::Purpose::control, c,
                                                 std::chrono::seconds(5), Clock::now() + std::chrono::seconds(5),
                                                 "bench", "bench", &retry);
      t.push_back(us_since(t0));
      if (fd) ::close(*fd);
    }
    std::printf("{\"what\": \"handshake\", \"secret\": %s, \"iters\": %d, \"median_us\": %.1f, \"p90_us\": %.1f}\n",
                secret ? "true" : "false", iters, percentile(t, 0.5), percentile(t, 0.9));
    std::fflush(stdout);
  }
}

void job(int iters) {
  const auto env = dopt::launch_env_from_environment();
  if (!env) {
    std::fprintf(stderr, "dopt_bench_auth job: start it with dopt-run (or another launcher)\n");
    std::exit(2);
  }
  dopt::Runtime rt;
  const auto t0 = Clock::now();
  dopt::ProcessGroup world = dopt::init_process_group(rt, *env);
  dopt::Tensor init = dopt::Tensor::from_vector(std::vector<double>{us_since(t0) / 1000.0});
  world.all_reduce(init, dopt::ReduceOp::max);
  dopt::Tensor t = dopt::Tensor::full({1024}, 1.0);  // 4 KiB of float32
  for (int i = 0; i < iters / 10 + 10; ++i) world.all_reduce(t);  // warm-up
  std::vector<double> us(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    const auto c0 = Clock::now();
    world.all_reduce(t);
    us[static_cast<std::size_t>(i)] = us_since(c0);
  }
  dopt::Tensor all = dopt::Tensor::from_vector(us);
  world.all_reduce(all, dopt::ReduceOp::max);
  if (env->rank == 0) {
    const double* p = all.data<double>();
    std::vector<double> v(p, p + iters);
    const std::string tr = dopt::settings::text("DOPT_TRANSPORT").value_or("auto");
    std::printf("{\"what\": \"job\", \"secret\": %s, \"transport\": \"%s\", \"world_size\": %d, \"init_ms\": %.1f, "
                "\"iters\": %d, \"median_us\": %.1f, \"min_us\": %.1f}\n",
                env->secret.empty() ? "false" : "true", tr.c_str(), env->world_size,
                init.data<double>()[0], iters, percentile(v, 0.5), percentile(v, 0.0));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dopt_bench_auth: what dopt's authentication costs"};
  std::string mode;
  int iters = 2000;
  app.add_option("mode", mode, "handshake | job")->required()->check(CLI::IsMember({"handshake", "job"}));
  app.add_option("--iters", iters, "Handshakes, or all_reduce calls")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (mode == "handshake") handshakes(iters);
  else job(iters);
  return 0;
}
