#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/launch_env.hpp"

using namespace dopt;
using Env = std::map<std::string, std::string>;

namespace {
// The message of the ValueError parse_launch_env throws for `env`.
std::string error_of(const Env& env) {
  try {
    parse_launch_env(env);
  } catch (const ValueError& e) {
    return e.what();
  }
  FAIL("parse_launch_env did not throw ValueError");
  return {};
}
}  // namespace

TEST_CASE("launch_env: torchrun variables", "[launch]") {
  const LaunchEnv le = parse_launch_env({{"RANK", "5"},
                                         {"WORLD_SIZE", "8"},
                                         {"LOCAL_RANK", "1"},
                                         {"LOCAL_WORLD_SIZE", "4"},
                                         {"MASTER_ADDR", "node0.cluster"},
                                         {"MASTER_PORT", "1234"}});
  CHECK(le.source == "torchrun");
  CHECK(le.rank == 5);
  CHECK(le.world_size == 8);
  CHECK(le.local_rank == 1);
  CHECK(le.local_world_size == 4);
  CHECK(le.master_addr == "node0.cluster");
  CHECK(le.master_port == 1234);
}

TEST_CASE("launch_env: defaults for a single-node launch by hand", "[launch]") {
  const LaunchEnv le = parse_launch_env({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
  CHECK(le.source == "torchrun");
  CHECK(le.rank == 2);
  CHECK(le.world_size == 3);
  CHECK(le.local_rank == 2);
  CHECK(le.local_world_size == 3);
  CHECK(le.master_addr == "127.0.0.1");
  CHECK(le.master_port == 29500);
}

TEST_CASE("launch_env: OpenMPI variables", "[launch]") {
  const LaunchEnv le = parse_launch_env({{"OMPI_COMM_WORLD_RANK", "3"},
                                         {"OMPI_COMM_WORLD_SIZE", "4"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(le.source == "openmpi");
  CHECK(le.rank == 3);
  CHECK(le.world_size == 4);
  CHECK(le.local_rank == 1);
  CHECK(le.local_world_size == 2);
  CHECK(le.master_addr == "127.0.0.1");
  CHECK(le.master_port == 29500);

  const LaunchEnv with_master = parse_launch_env({{"OMPI_COMM_WORLD_RANK", "0"},
                                                  {"OMPI_COMM_WORLD_SIZE", "1"},
                                                  {"MASTER_ADDR", "10.0.0.7"},
                                                  {"MASTER_PORT", "40000"}});
  CHECK(with_master.master_addr == "10.0.0.7");
  CHECK(with_master.master_port == 40000);
}

TEST_CASE("launch_env: SLURM variables", "[launch]") {
  SECTION("SLURM_NTASKS_PER_NODE") {
    const LaunchEnv le = parse_launch_env({{"SLURM_PROCID", "6"},
                                           {"SLURM_NTASKS", "8"},
                                           {"SLURM_LOCALID", "2"},
                                           {"SLURM_NTASKS_PER_NODE", "4"},
                                           {"MASTER_ADDR", "n1"}});
    CHECK(le.source == "slurm");
    CHECK(le.rank == 6);
    CHECK(le.world_size == 8);
    CHECK(le.local_rank == 2);
    CHECK(le.local_world_size == 4);
    CHECK(le.master_addr == "n1");
  }
  SECTION("SLURM_TASKS_PER_NODE with repetition") {
    const LaunchEnv le = parse_launch_env({{"SLURM_PROCID", "1"},
                                           {"SLURM_NTASKS", "8"},
                                           {"SLURM_LOCALID", "1"},
                                           {"SLURM_TASKS_PER_NODE", "4(x2)"}});
    CHECK(le.local_world_size == 4);
  }
  SECTION("heterogeneous SLURM_TASKS_PER_NODE indexed by SLURM_NODEID") {
    const LaunchEnv le = parse_launch_env({{"SLURM_PROCID", "8"},
                                           {"SLURM_NTASKS", "9"},
                                           {"SLURM_LOCALID", "0"},
                                           {"SLURM_NODEID", "2"},
                                           {"SLURM_TASKS_PER_NODE", "4(x2),1"}});
    CHECK(le.local_world_size == 1);
    CHECK(le.local_rank == 0);
  }
  SECTION("SLURM_NPROCS when SLURM_NTASKS is absent") {
    const LaunchEnv le = parse_launch_env({{"SLURM_PROCID", "0"}, {"SLURM_NPROCS", "2"}});
    CHECK(le.world_size == 2);
    CHECK(le.local_world_size == 2);
  }
}

TEST_CASE("launch_env: torchrun beats OpenMPI beats SLURM", "[launch]") {
  Env env{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}};
  CHECK(parse_launch_env(env).source == "slurm");
  env["OMPI_COMM_WORLD_RANK"] = "0";
  env["OMPI_COMM_WORLD_SIZE"] = "3";
  CHECK(parse_launch_env(env).source == "openmpi");
  CHECK(parse_launch_env(env).world_size == 3);
  env["RANK"] = "3";
  env["WORLD_SIZE"] = "4";
  const LaunchEnv le = parse_launch_env(env);
  CHECK(le.source == "torchrun");
  CHECK(le.rank == 3);
  CHECK(le.world_size == 4);
}

TEST_CASE("launch_env: malformed and contradictory values name the variable", "[launch]") {
  using Catch::Matchers::Contains;
  CHECK_THAT(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
             Contains("RANK='4' is out of range for WORLD_SIZE='4'"));
  CHECK_THAT(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), Contains("RANK='-1' is negative"));
  CHECK_THAT(error_of({{"RANK", "one"}, {"WORLD_SIZE", "4"}}), Contains("RANK='one' is not an integer"));
  CHECK_THAT(error_of({{"RANK", "1x"}, {"WORLD_SIZE", "4"}}), Contains("RANK='1x' is not an integer"));
  CHECK_THAT(error_of({{"RANK", ""}, {"WORLD_SIZE", "4"}}), Contains("RANK='' is not an integer"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), Contains("WORLD_SIZE='0' is out of range"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}),
             Contains("WORLD_SIZE='99999999999999999999' is out of range"));
  CHECK_THAT(error_of({{"RANK", "0"}}), Contains("WORLD_SIZE is not set but RANK is"));
  CHECK_THAT(error_of({{"WORLD_SIZE", "2"}}), Contains("RANK is not set but WORLD_SIZE is"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
             Contains("LOCAL_RANK='2' is out of range for LOCAL_WORLD_SIZE=2"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "3"}}),
             Contains("LOCAL_WORLD_SIZE=3 is larger than WORLD_SIZE='2'"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
             Contains("LOCAL_RANK is not set but LOCAL_WORLD_SIZE is"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "65536"}}),
             Contains("MASTER_PORT='65536' is out of range (expected 1..65535)"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}),
             Contains("MASTER_PORT='0' is out of range"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}),
             Contains("MASTER_PORT='http' is not an integer"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}}),
             Contains("MASTER_ADDR is set but empty"));
  CHECK_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
             Contains("OMPI_COMM_WORLD_RANK='2' is out of range for OMPI_COMM_WORLD_SIZE='2'"));
  CHECK_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"},
                       {"SLURM_TASKS_PER_NODE", "4(x3)"}}),
             Contains("SLURM_TASKS_PER_NODE='4(x3)' adds up to 12 tasks but SLURM_NTASKS is 8"));
  CHECK_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"},
                       {"SLURM_TASKS_PER_NODE", "4(2)"}}),
             Contains("SLURM_TASKS_PER_NODE='4(2)' is malformed"));
  CHECK_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "0"},
                       {"SLURM_TASKS_PER_NODE", "4,1"}}),
             Contains("differs between nodes and SLURM_NODEID is not set"));
  CHECK_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "4"},
                       {"SLURM_NTASKS_PER_NODE", "4"}}),
             Contains("SLURM_LOCALID='4' is out of range for SLURM_NTASKS_PER_NODE=4"));
  CHECK_THAT(error_of({}), Contains("no launch contract in the environment"));
  // The op is named in every message.
  CHECK_THAT(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), Contains("launch_env: "));
}

TEST_CASE("launch_env: from this process's environment", "[launch]") {
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                         "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                         "SLURM_NPROCS"};
  // Save and clear, so the test holds also when run under a launcher.
  std::map<std::string, std::string> saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved[n] = v;
    ::unsetenv(n);
  }
  CHECK_FALSE(launch_env_from_environment().has_value());
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_PORT", "31000", 1);
  const std::optional<LaunchEnv> le = launch_env_from_environment();
  REQUIRE(le.has_value());
  CHECK(le->rank == 1);
  CHECK(le->world_size == 2);
  CHECK(le->master_port == 31000);
  ::setenv("RANK", "2", 1);
  CHECK_THROWS_AS(launch_env_from_environment(), ValueError);
  for (const char* n : names) ::unsetenv(n);
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}

TEST_CASE("launch_env: the job id comes from DOPT_JOB_ID or the launcher", "[launch][security]") {
  const Env base{{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  auto with = [&](Env extra) {
    Env e = base;
    e.insert(extra.begin(), extra.end());
    return parse_launch_env(e);
  };
  CHECK(with({}).job_id.empty());
  CHECK(with({}).describe_job() == "no job id");
  LaunchEnv le = with({{"DOPT_JOB_ID", "nightly-7"}, {"SLURM_JOB_ID", "123"}});
  CHECK(le.job_id == "nightly-7");
  CHECK(le.job_id_source == "DOPT_JOB_ID");
  CHECK(le.describe_job() == "job 'nightly-7' (from DOPT_JOB_ID)");
  CHECK(with({{"TORCHELASTIC_RUN_ID", "abc"}, {"SLURM_JOB_ID", "9"}}).job_id == "abc");
  CHECK(with({{"TORCHELASTIC_RUN_ID", "none"}, {"SLURM_JOB_ID", "9"}}).job_id == "9");  // torchrun's default
  CHECK(with({{"OMPI_MCA_ess_base_jobid", "1745027073"}, {"SLURM_JOB_ID", "9"}}).job_id == "1745027073");
  CHECK(with({{"PMIX_NAMESPACE", "prterun-n1-4242@1"}}).job_id_source == "PMIX_NAMESPACE");
  le = with({{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}});
  CHECK(le.job_id == "77.3");
  CHECK(le.job_id_source == "SLURM_JOB_ID");
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DOPT_JOB_ID", "two words"}}),
             Catch::Contains("DOPT_JOB_ID='two words' holds a blank"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DOPT_JOB_ID", std::string(256, 'x')}}),
             Catch::Contains("DOPT_JOB_ID is 256 characters long (at most 255)"));
  CHECK_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DOPT_JOB_ID", ""}}),
             Catch::Contains("DOPT_JOB_ID is set but empty"));
}

TEST_CASE("launch_env: the secret comes from a private file or DOPT_SECRET", "[launch][security]") {
  const std::string dir = "/tmp/dopt_launch_env_test_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  const std::string file = dir + "/secret";
  auto write = [&](const std::string& text, mode_t mode) {
    ::unlink(file.c_str());
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    ::close(fd);
    REQUIRE(::chmod(file.c_str(), mode) == 0);
  };
  const Env base{{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  auto with = [&](Env extra) {
    Env e = base;
    e.insert(extra.begin(), extra.end());
    return e;
  };
  CHECK(parse_launch_env(base).secret.empty());
  write("0123456789abcdef0123\n", 0600);
  LaunchEnv le = parse_launch_env(with({{"DOPT_SECRET_FILE", file}}));
  CHECK(le.secret == "0123456789abcdef0123");
  CHECK(le.secret_source == "DOPT_SECRET_FILE=" + file);
  le = parse_launch_env(with({{"DOPT_SECRET", "a-long-enough-secret"}}));
  CHECK(le.secret == "a-long-enough-secret");
  CHECK(le.secret_source == "DOPT_SECRET");
  write("0123456789abcdef0123\n", 0640);
  CHECK_THAT(error_of(with({{"DOPT_SECRET_FILE", file}})),
             Catch::Contains("DOPT_SECRET_FILE='" + file + "' can be read or written by others (mode 0640): chmod 600 it"));
  write("short", 0600);
  CHECK_THAT(error_of(with({{"DOPT_SECRET_FILE", file}})), Catch::Contains("is 5 bytes long; use at least 16"));
  CHECK_THAT(error_of(with({{"DOPT_SECRET_FILE", dir + "/none"}})),
             Catch::Contains("cannot be opened: No such file or directory"));
  CHECK_THAT(error_of(with({{"DOPT_SECRET_FILE", dir}})), Catch::Contains("is not a regular file"));
  CHECK_THAT(error_of(with({{"DOPT_SECRET_FILE", file}, {"DOPT_SECRET", "x"}})),
             Catch::Contains("DOPT_SECRET and DOPT_SECRET_FILE are both set"));
  ::unlink(file.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("launch_env: bind address, interface, advertised address and hand-shake timeout", "[launch][security]") {
  const Env base{{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  auto with = [&](Env extra) {
    Env e = base;
    e.insert(extra.begin(), extra.end());
    return e;
  };
  LaunchEnv le = parse_launch_env(base);
  CHECK(le.bind_addr.empty());
  CHECK(le.handshake_timeout == std::chrono::milliseconds(10000));
  le = parse_launch_env(with({{"DOPT_BIND_ADDR", "10.0.0.5"}, {"DOPT_ADVERTISE_ADDR", "node5"},
                              {"DOPT_HANDSHAKE_TIMEOUT_MS", "2500"}}));
  CHECK(le.bind_addr == "10.0.0.5");
  CHECK(le.advertise_addr == "node5");
  CHECK(le.handshake_timeout == std::chrono::milliseconds(2500));
  CHECK(parse_launch_env(with({{"DOPT_SOCKET_IFNAME", "eth0"}})).socket_ifname == "eth0");
  CHECK_THAT(error_of(with({{"DOPT_BIND_ADDR", "a"}, {"DOPT_SOCKET_IFNAME", "eth0"}})),
             Catch::Contains("DOPT_BIND_ADDR and DOPT_SOCKET_IFNAME are both set"));
  CHECK_THAT(error_of(with({{"DOPT_HANDSHAKE_TIMEOUT_MS", "0"}})),
             Catch::Contains("DOPT_HANDSHAKE_TIMEOUT_MS='0' is out of range"));
}

TEST_CASE("launch_env: DOPT_PORT_RANGE and torchrun's agent store", "[launch][network]") {
  const Env base{{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  auto with = [&](Env extra) {
    Env e = base;
    e.insert(extra.begin(), extra.end());
    return e;
  };
  LaunchEnv le = parse_launch_env(base);
  CHECK(le.port_range_lo == 0);
  CHECK(le.port_range_hi == 0);
  CHECK_FALSE(le.agent_store);
  le = parse_launch_env(with({{"DOPT_PORT_RANGE", "29600-29699"}}));
  CHECK(le.port_range_lo == 29600);
  CHECK(le.port_range_hi == 29699);
  CHECK(parse_launch_env(with({{"DOPT_PORT_RANGE", " 40000:40000 "}})).port_range_hi == 40000);
  CHECK_THAT(error_of(with({{"DOPT_PORT_RANGE", "29600"}})), Catch::Contains("is not a range LOW-HIGH"));
  CHECK_THAT(error_of(with({{"DOPT_PORT_RANGE", "29700-29600"}})), Catch::Contains("is not a range of ports"));
  CHECK_THAT(error_of(with({{"DOPT_PORT_RANGE", "0-10"}})), Catch::Contains("is not a range of ports"));
  CHECK_THAT(error_of(with({{"DOPT_PORT_RANGE", "a-b"}})), Catch::Contains("DOPT_PORT_RANGE"));
  le = parse_launch_env(with({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  CHECK(le.agent_store);
  CHECK(le.restart_count == 2);
  CHECK_FALSE(parse_launch_env(with({{"TORCHELASTIC_USE_AGENT_STORE", "False"}})).agent_store);
}
