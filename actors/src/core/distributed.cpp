// init_process_group / run_distributed (distributed.hpp).
#include "dopt/actors/distributed.hpp"
#include "collectives/access.hpp"

#include "dopt/runtime/error.hpp"
#include "core/ranks.hpp"

namespace dopt {

ProcessGroup init_process_group(Runtime& runtime, const LaunchEnv& env, const InitOptions& options) {
  return detail::init_world_group(runtime, env, options);
}

void run_distributed(const std::function<void(RankContext&)>& fn, const RunOptions& options) {
  auto env = launch_env_from_environment();
  if (!env) {
    SimulateOptions so;
    so.runtime_options = options.runtime_options;
    simulate(options.simulated_ranks, fn, so);
    return;
  }
  Runtime rt(options.runtime_options);
  ProcessGroup world = init_process_group(rt, *env, options.init);
  RankContext ctx(env->rank, env->world_size, world);
  try {
    fn(ctx);
  } catch (...) {
    detail::Access::impl(world)->endpoint->report_failure("run_distributed: the rank's function threw");
    throw;
  }
}

}  // namespace dopt
