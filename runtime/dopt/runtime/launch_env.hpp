#pragma once
// The launch contract: which rank this process is, how many there are, and
// where rank 0 listens for the rendezvous. Read from the environment as the
// usual launchers set it (docs/launching.md):
//
//   source "torchrun"  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//                      MASTER_ADDR, MASTER_PORT (torchrun, dopt-run, by hand)
//   source "openmpi"   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                      OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   source "slurm"     SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS),
//                      SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
//                      SLURM_TASKS_PER_NODE ("4(x2),3", indexed by SLURM_NODEID)
//
// The first family that has any of its rank/size variables set wins, in the
// order above; the others are then ignored. Within the family, the rank and
// the world size are both required. When the local rank / local world size
// are absent, the launch is taken as single-node: local_rank = rank,
// local_world_size = world_size. MASTER_ADDR and MASTER_PORT are read for
// every family and default to 127.0.0.1 and 29500.
//
// Every malformed or contradictory value throws dopt::ValueError (op
// "launch_env") naming the variable and its value: a non-integer, a negative
// number, a rank >= world size, a local rank >= local world size, a local
// world size larger than the world size, an empty MASTER_ADDR, a MASTER_PORT
// outside 1..65535, a SLURM_TASKS_PER_NODE that does not add up to the number
// of tasks.
#include <map>
#include <optional>
#include <string>

namespace dopt {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Which family of variables it was read from: "torchrun", "openmpi" or "slurm".
  std::string source;
};

/// Default MASTER_ADDR / MASTER_PORT when the environment does not set them.
inline constexpr const char* kDefaultMasterAddr = "127.0.0.1";
inline constexpr int kDefaultMasterPort = 29500;

/// Parses the launch contract from `env` (variable name -> value).
/// Throws ValueError when no family's variables are present, or when a value
/// is malformed or contradicts another (see above).
LaunchEnv parse_launch_env(const std::map<std::string, std::string>& env);

/// Reads this process's environment. std::nullopt when none of the rank/size
/// variables of any family is set (not launched by a launcher); throws
/// ValueError like parse_launch_env when they are set but wrong.
std::optional<LaunchEnv> launch_env_from_environment();

}  // namespace dopt
