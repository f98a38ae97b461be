// Quoted by docs/launching.md (tests/check_docs.py checks the quotes; CI compiles this file).
#include <cstdio>
#include <optional>

#include "dopt/actors/distributed.hpp"
#include "dopt/runtime/launch_env.hpp"

void read_the_contract() {
  std::optional<dopt::LaunchEnv> le = dopt::launch_env_from_environment();
  if (!le) return;  // not started by a launcher
  // le->rank, world_size, local_rank, local_world_size, master_addr,
  // master_port, source ("torchrun" | "openmpi" | "slurm")
  std::printf("rank %d of %d\n", le->rank, le->world_size);
}

int join_the_world(dopt::Tensor grad) {
  dopt::Runtime rt;
  auto env = dopt::launch_env_from_environment();          // any of the launchers above
  if (!env) {
    std::fprintf(stderr, "start me with dopt-run, torchrun, mpirun or srun\n");
    return 2;
  }
  dopt::ProcessGroup world = dopt::init_process_group(rt, *env);
  world.all_reduce(grad);
  return 0;
}
