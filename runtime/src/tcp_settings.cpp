// TcpMesh's settings: the DOPT_TCP_* environment variables.
#include "tcp_settings.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/parallel.hpp"
#include "tcp_wire.hpp"

namespace dopt::transport::tcp_detail {

namespace {

constexpr int k_default_streams = 2;
constexpr int k_max_streams = 16;
constexpr std::size_t k_default_stripe_min = 256 * 1024;
// Striping by default only where a rank's I/O thread and its data threads
// can each run on a CPU of their own: on 2 CPUs whole messages measured
// 1.2-1.6x faster across two network namespaces and up to 2x at 64 MiB on
// loopback (docs/performance.md, 2026-12-04).
constexpr int k_stripe_cpus = 4;
constexpr std::size_t k_never = std::size_t(1) << 62;

// An integer setting from the environment (K, M, G suffixes: binary units).
long long env_setting(const char* name, long long lo, long long hi, long long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 10);
  bool ok = errno == 0 && end != v;
  if (ok && *end) {
    const char u = *end++;
    const int shift = (u == 'K' || u == 'k') ? 10 : (u == 'M' || u == 'm') ? 20 : (u == 'G' || u == 'g') ? 30 : -1;
    if (shift < 0 || (*end && !((*end == 'i' || *end == 'B') && (end[1] == 0 || (end[1] == 'B' && !end[2])))))
      ok = false;
    else
      x <<= shift;
  }
  if (!ok || x < lo || x > hi)
    throw ValueError(k_op, std::string(name) + "=\"" + v + "\" is not a whole number in [" + std::to_string(lo) +
                               ", " + std::to_string(hi) + "]");
  return x;
}

}  // namespace

void resolve_settings(TcpMeshOptions& options, int rank) {
  if (options.streams < 0) options.streams = int(env_setting("DOPT_TCP_STREAMS", 0, k_max_streams, k_default_streams));
  if (options.streams > k_max_streams)
    throw ValueError(k_op, "streams must be at most " + std::to_string(k_max_streams) + ", got " +
                               std::to_string(options.streams), rank);
  if (options.stripe_min_bytes == 0)
    options.stripe_min_bytes = std::size_t(env_setting(
        "DOPT_TCP_STRIPE_MIN", 1, 1LL << 40,
        (long long)(hardware_threads() >= k_stripe_cpus ? k_default_stripe_min : k_never)));
  if (options.poll_us < 0)
    options.poll_us = int(env_setting("DOPT_TCP_POLL_US", 0, 1000000,
                                      options.ranks_on_host > 0 ? TcpMesh::default_poll_us(options.ranks_on_host) : 0));
  if (options.caller_drives < 0) options.caller_drives = int(env_setting("DOPT_TCP_CALLER_DRIVES", 0, 1, 1));
  if (options.pool_bytes == SIZE_MAX)
    options.pool_bytes = std::size_t(env_setting("DOPT_TCP_POOL_BYTES", 0, 1LL << 40, 64LL << 20));
  if (options.socket_buffer_bytes == 0)
    options.socket_buffer_bytes = std::size_t(env_setting("DOPT_TCP_SOCKET_BUFFER", 0, 1LL << 30, 0));
}

}  // namespace dopt::transport::tcp_detail
