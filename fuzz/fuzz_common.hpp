#pragma once
// What the fuzz targets and the seeds' writer (make_seeds.cpp) share.
#include <string>

#include "dopt/runtime/internal/handshake.hpp"

namespace dopt_fuzz {

/// The credentials of the handshake target's both sides: one job, with or
/// without a secret.
inline dopt::net::Credentials creds(bool secret, int rank) {
  dopt::net::Credentials c;
  c.job_id = "fuzz-job";
  c.secret = secret ? "0123456789abcdef0123456789abcdef" : "";
  c.rank = rank;
  c.world_size = 4;
  return c;
}

}  // namespace dopt_fuzz
