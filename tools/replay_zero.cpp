// Replay of wrapper 'zero' (placeholder until its issue lands: reports the case
// as unsupported, exit status 3 of dopt-replay).
#include "replay_case.hpp"

namespace dopt::replay {

ReplayOutput replay_zero(const Case& c, int /*num_threads*/) {
  throw UnsupportedCase("replay", "wrapper '" + c.wrapper_kind + "' is not supported yet");
}

}  // namespace dopt::replay
