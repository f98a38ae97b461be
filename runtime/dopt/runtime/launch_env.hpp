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
//
// Who may join, and where to listen (every family; docs/launching.md):
//   job_id       DOPT_JOB_ID, else TORCHELASTIC_RUN_ID (unless "none"), else
//                OpenMPI's job (OMPI_MCA_ess_base_jobid, or PMIX_NAMESPACE),
//                else SLURM_JOB_ID (".SLURM_STEP_ID" appended when set); ""
//                when none is set. Ranks of different job ids never join
//                each other: every connection between ranks presents it.
//                At most 255 printable ASCII characters.
//   secret       the content of the file DOPT_SECRET_FILE (a regular file
//                of this user that nobody else may read or write, trailing
//                blanks and newlines dropped), or DOPT_SECRET; at least 16
//                bytes; both set is an error. "" = no authentication. When
//                set, every connection between ranks proves knowledge of
//                it (HMAC-SHA256 challenge-response, never sent in clear).
//                A missing, unreadable or too open file is a ValueError.
//   bind_addr    DOPT_BIND_ADDR: the address (or host name) every listener
//                of this rank binds to ("0.0.0.0" or "::" for every
//                interface); "" = chosen from MASTER_ADDR (docs).
//   socket_ifname DOPT_SOCKET_IFNAME: bind to this interface's address
//                instead (exclusive with DOPT_BIND_ADDR).
//   advertise_addr DOPT_ADVERTISE_ADDR: the address peers connect to for this
//                rank when it differs from the bind address.
//   handshake_timeout DOPT_HANDSHAKE_TIMEOUT_MS (default 10000): how long a
//                connection between ranks may take to answer its handshake,
//                and how long the ranks may take to connect to each other
//                once all have arrived.
//   port_range   DOPT_PORT_RANGE=LOW-HIGH: every port a rank listens on
//                besides MASTER_PORT (control, data, RPC ports) is taken
//                from this range (for firewalls); unset: ephemeral ports.
//   agent_store  TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent holds
//                MASTER_PORT with its own store (torchrun's default static
//                rendezvous); dopt's rendezvous then listens on a port that
//                rank 0 publishes in that store (restart_count from
//                TORCHELASTIC_RESTART_COUNT keys it).
#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace dopt {

/// Default MASTER_ADDR / MASTER_PORT when the environment does not set them.
inline constexpr const char* kDefaultMasterAddr = "127.0.0.1";
inline constexpr int kDefaultMasterPort = 29500;
/// Default DOPT_HANDSHAKE_TIMEOUT_MS.
inline constexpr int kDefaultHandshakeTimeoutMs = 10000;

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Which family of variables it was read from: "torchrun", "openmpi" or "slurm".
  std::string source;

  // --- who may join, where to listen (see the top of this file) ---
  std::string job_id;
  /// The variable job_id came from ("DOPT_JOB_ID", "SLURM_JOB_ID", ...); "" when none.
  std::string job_id_source;
  std::string secret;
  /// "DOPT_SECRET_FILE=<path>" or "DOPT_SECRET"; "" when there is no secret.
  std::string secret_source;
  std::string bind_addr;
  std::string socket_ifname;
  std::string advertise_addr;
  std::chrono::milliseconds handshake_timeout{kDefaultHandshakeTimeoutMs};
  /// DOPT_PORT_RANGE; 0, 0 = ephemeral ports.
  int port_range_lo = 0;
  int port_range_hi = 0;
  bool agent_store = false;
  int restart_count = 0;

  /// "job 'x' (from DOPT_JOB_ID)" or "no job id", for messages.
  std::string describe_job() const;
};


/// Parses the launch contract from `env` (variable name -> value); reads the
/// file DOPT_SECRET_FILE names. Throws ValueError when no family's variables
/// are present, or when a value is malformed or contradicts another (see above).
LaunchEnv parse_launch_env(const std::map<std::string, std::string>& env);

/// Reads this process's environment. std::nullopt when none of the rank/size
/// variables of any family is set (not launched by a launcher); throws
/// ValueError like parse_launch_env when they are set but wrong.
std::optional<LaunchEnv> launch_env_from_environment();

}  // namespace dopt
