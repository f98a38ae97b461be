// dopt::this_host_id (host.hpp): the measurement of core/host_identity.cpp.
#include "dopt/actors/host.hpp"
#include "dopt/runtime/settings.hpp"

#include <cstdlib>

#include "core/host_identity.hpp"

namespace dopt {

std::string this_host_id() {
  if (auto id = settings::text("DOPT_HOST_ID")) return *id;
  return detail::shared_memory_id();
}

}  // namespace dopt
