#pragma once
// Internal to TcpMesh: its settings from the environment. Not installed.
#include "dopt/runtime/internal/tcp_transport.hpp"

namespace dopt::transport::tcp_detail {

/// Fills in what `options` leave to the environment (docs/transport.md):
/// streams < 0 from DOPT_TCP_STREAMS (0..16, default 2), stripe_min_bytes == 0
/// from DOPT_TCP_STRIPE_MIN (default 256 KiB where the process may run on 4
/// CPUs or more, else 2^62: no striping), socket_buffer_bytes == 0 from
/// DOPT_TCP_SOCKET_BUFFER (default 0: the kernel's), pool_bytes == SIZE_MAX
/// from DOPT_TCP_POOL_BYTES (default 64 MiB), poll_us < 0 from
/// DOPT_TCP_POLL_US (0..1000000; default TcpMesh::default_poll_us(ranks_on_host),
/// 0 when ranks_on_host is 0). Throws ValueError for a
/// variable that is not a whole number in range, or for streams above 16
/// (that message names `rank`).
void resolve_settings(TcpMeshOptions& options, int rank);

}  // namespace dopt::transport::tcp_detail
