#pragma once
// dopt-run's nodes (dopt_run.cpp; docs/launching.md): how many (--nnodes), and
// the probes of ports on this node and rank 0's.
#include <string>

namespace dopt_run {

/// --nnodes M (min = max = M) or MIN:MAX.
struct NodeCount {
  int min = 1;
  int max = 1;
};

/// Parses --nnodes; CLI::ValidationError naming --nnodes for anything else
/// (not a whole number >= 1, too large, MIN > MAX, MIN < MAX with
/// `on_failure` "stop").
NodeCount parse_nnodes(const std::string& text, const std::string& on_failure);

/// A free TCP port on 127.0.0.1 (bound and released), or -1.
int pick_free_port();

/// Whether every address of host:port refuses a TCP connection (nothing
/// listens there), each tried for up to 1 s; false when one accepts, does not
/// answer or the name does not resolve. A connection closed before a byte is
/// not reported by dopt's listeners (auth_listener.cpp).
bool refuses_connections(const std::string& host, int port);

}  // namespace dopt_run
