// TcpMesh's settings: the DOPT_TCP_* environment variables.
#include "tcp_settings.hpp"
#include "dopt/runtime/settings.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/parallel.hpp"
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

// An integer setting (settings_table.def holds its range and units).
long long env_setting(const char* name, long long fallback) { return settings::integer(name).value_or(fallback); }

}  // namespace

void resolve_settings(TcpMeshOptions& options, int rank) {
  if (options.streams < 0) options.streams = int(env_setting("DOPT_TCP_STREAMS", k_default_streams));
  if (options.streams > k_max_streams)
    throw ValueError(k_op, "streams must be at most " + std::to_string(k_max_streams) + ", got " +
                               std::to_string(options.streams), rank);
  if (options.stripe_min_bytes == 0)
    options.stripe_min_bytes = std::size_t(env_setting(
        "DOPT_TCP_STRIPE_MIN",
        (long long)(hardware_threads() >= k_stripe_cpus ? k_default_stripe_min : k_never)));
  if (options.poll_us < 0)
    options.poll_us = int(env_setting("DOPT_TCP_POLL_US",
                                      options.ranks_on_host > 0 ? TcpMesh::default_poll_us(options.ranks_on_host) : 0));
  if (options.caller_drives < 0) options.caller_drives = int(env_setting("DOPT_TCP_CALLER_DRIVES", 1));
  if (options.pool_bytes == SIZE_MAX)
    options.pool_bytes = std::size_t(env_setting("DOPT_TCP_POOL_BYTES", 64LL << 20));
  if (options.socket_buffer_bytes == 0)
    options.socket_buffer_bytes = std::size_t(env_setting("DOPT_TCP_SOCKET_BUFFER", 0));
}

}  // namespace dopt::transport::tcp_detail
