#include "dopt/runtime/launch_env.hpp"
#include "dopt/runtime/settings.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dopt/runtime/error.hpp"


namespace dopt {
namespace {

constexpr const char* kOp = "launch_env";

using Env = std::map<std::string, std::string>;

const std::string* find(const Env& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// A decimal integer, optionally signed and surrounded by blanks; nothing else.
long long parse_integer(const std::string& name, const std::string& value) {
  std::size_t b = 0, e = value.size();
  while (b < e && std::isspace(static_cast<unsigned char>(value[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(value[e - 1]))) --e;
  std::size_t i = b;
  bool neg = false;
  if (i < e && (value[i] == '+' || value[i] == '-')) neg = value[i++] == '-';
  if (i == e) throw ValueError(kOp, name + "=" + quoted(value) + " is not an integer");
  long long v = 0;
  for (; i < e; ++i) {
    const char c = value[i];
    if (c < '0' || c > '9') throw ValueError(kOp, name + "=" + quoted(value) + " is not an integer");
    if (v > (LLONG_MAX - (c - '0')) / 10)
      throw ValueError(kOp, name + "=" + quoted(value) + " is out of range");
    v = v * 10 + (c - '0');
  }
  return neg ? -v : v;
}

int parse_int(const std::string& name, const std::string& value, long long min_value) {
  const long long v = parse_integer(name, value);
  if (v < min_value) {
    throw ValueError(kOp, name + "=" + quoted(value) + " is " + (v < 0 ? "negative" : "out of range") +
                              " (expected >= " + std::to_string(min_value) + ")");
  }
  if (v > INT_MAX) throw ValueError(kOp, name + "=" + quoted(value) + " is out of range");
  return static_cast<int>(v);
}

struct Family {
  const char* source;
  const char* rank;
  const char* size;
  const char* size_alt;  // nullable
  const char* local_rank;
  const char* local_size;  // nullable (slurm: computed)
};

constexpr Family kTorchrun{"torchrun", "RANK", "WORLD_SIZE", nullptr, "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr Family kOpenMpi{"openmpi",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE",
                          nullptr,
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr Family kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", nullptr};

bool present(const Env& env, const Family& f) {
  return find(env, f.rank) || find(env, f.size) || (f.size_alt && find(env, f.size_alt));
}

// SLURM_TASKS_PER_NODE: comma-separated counts, each optionally "(xN)"
// repeated, e.g. "4(x2),3" -> {4, 4, 3}.
std::vector<int> parse_tasks_per_node(const std::string& value) {
  const std::string name = "SLURM_TASKS_PER_NODE";
  std::vector<int> out;
  std::size_t pos = 0;
  auto bad = [&]() -> ValueError {
    return ValueError(kOp, name + "=" + quoted(value) +
                               " is malformed (expected counts like '4(x2),3')");
  };
  if (value.empty()) throw bad();
  while (pos <= value.size()) {
    std::size_t end = value.find(',', pos);
    if (end == std::string::npos) end = value.size();
    const std::string item = value.substr(pos, end - pos);
    std::string count = item;
    long long repeat = 1;
    const std::size_t paren = item.find('(');
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') throw bad();
      count = item.substr(0, paren);
      const std::string rep = item.substr(paren + 2, item.size() - paren - 3);
      if (rep.empty() || rep.find_first_not_of("0123456789") != std::string::npos) throw bad();
      repeat = parse_integer(name, rep);
    }
    if (count.empty() || count.find_first_not_of("0123456789") != std::string::npos) throw bad();
    const long long c = parse_integer(name, count);
    if (c < 1 || repeat < 1 || c > INT_MAX || repeat > (1 << 20)) throw bad();
    for (long long r = 0; r < repeat; ++r) out.push_back(static_cast<int>(c));
    if (end == value.size()) break;
    pos = end + 1;
  }
  return out;
}

int slurm_local_world_size(const Env& env, int world_size, bool& found) {
  found = false;
  if (const std::string* v = find(env, "SLURM_NTASKS_PER_NODE")) {
    found = true;
    return parse_int("SLURM_NTASKS_PER_NODE", *v, 1);
  }
  const std::string* tpn = find(env, "SLURM_TASKS_PER_NODE");
  if (!tpn) return 0;
  found = true;
  const std::vector<int> counts = parse_tasks_per_node(*tpn);
  long long total = 0;
  for (int c : counts) total += c;
  if (total != world_size) {
    throw ValueError(kOp, "SLURM_TASKS_PER_NODE=" + quoted(*tpn) + " adds up to " + std::to_string(total) +
                              " tasks but SLURM_NTASKS is " + std::to_string(world_size));
  }
  if (const std::string* node = find(env, "SLURM_NODEID")) {
    const int id = parse_int("SLURM_NODEID", *node, 0);
    if (id >= static_cast<int>(counts.size())) {
      throw ValueError(kOp, "SLURM_NODEID=" + quoted(*node) + " is out of range for SLURM_TASKS_PER_NODE=" +
                                quoted(*tpn) + " (" + std::to_string(counts.size()) + " nodes)");
    }
    return counts[id];
  }
  for (int c : counts) {
    if (c != counts[0]) {
      throw ValueError(kOp, "SLURM_TASKS_PER_NODE=" + quoted(*tpn) +
                                " differs between nodes and SLURM_NODEID is not set");
    }
  }
  return counts[0];
}

LaunchEnv parse_family(const Env& env, const Family& f) {
  LaunchEnv le;
  le.source = f.source;

  const std::string* rank = find(env, f.rank);
  std::string size_name = f.size;
  const std::string* size = find(env, f.size);
  if (!size && f.size_alt) {
    size = find(env, f.size_alt);
    size_name = f.size_alt;
  }
  if (!rank) {
    throw ValueError(kOp, std::string(f.rank) + " is not set but " + size_name + " is (" + f.source + " launch)");
  }
  if (!size) {
    throw ValueError(kOp, size_name + " is not set but " + f.rank + " is (" + f.source + " launch)");
  }
  le.rank = parse_int(f.rank, *rank, 0);
  le.world_size = parse_int(size_name, *size, 1);
  if (le.rank >= le.world_size) {
    throw ValueError(kOp, std::string(f.rank) + "=" + quoted(*rank) + " is out of range for " + size_name + "=" +
                              quoted(*size) + " (expected 0 <= " + f.rank + " < " + size_name + ")");
  }

  // Local world size first, so the local rank can be checked against it.
  std::string lsize_name = f.local_size ? f.local_size : "SLURM_NTASKS_PER_NODE";
  bool have_lsize = false;
  if (f.local_size) {
    if (const std::string* v = find(env, f.local_size)) {
      le.local_world_size = parse_int(f.local_size, *v, 1);
      have_lsize = true;
    }
  } else {
    le.local_world_size = slurm_local_world_size(env, le.world_size, have_lsize);
    if (have_lsize && !find(env, "SLURM_NTASKS_PER_NODE")) lsize_name = "SLURM_TASKS_PER_NODE";
  }
  if (!have_lsize) le.local_world_size = le.world_size;
  if (le.local_world_size > le.world_size) {
    throw ValueError(kOp, lsize_name + "=" + std::to_string(le.local_world_size) + " is larger than " +
                              size_name + "=" + quoted(*size));
  }

  if (const std::string* v = find(env, f.local_rank)) {
    le.local_rank = parse_int(f.local_rank, *v, 0);
    if (le.local_rank >= le.local_world_size) {
      throw ValueError(kOp, std::string(f.local_rank) + "=" + quoted(*v) + " is out of range for " +
                                (have_lsize ? lsize_name : size_name) + "=" +
                                std::to_string(le.local_world_size) + " (expected 0 <= " + f.local_rank + " < " +
                                (have_lsize ? lsize_name : size_name) + ")");
    }
  } else {
    if (have_lsize) {
      throw ValueError(kOp, std::string(f.local_rank) + " is not set but " + lsize_name + " is (" + f.source +
                                " launch)");
    }
    le.local_rank = le.rank;
  }

  if (const std::string* v = find(env, "MASTER_ADDR")) {
    std::size_t b = v->find_first_not_of(" \t");
    if (b == std::string::npos) throw ValueError(kOp, "MASTER_ADDR is set but empty");
    le.master_addr = v->substr(b, v->find_last_not_of(" \t") - b + 1);
  } else {
    le.master_addr = kDefaultMasterAddr;
  }
  if (const std::string* v = find(env, "MASTER_PORT")) {
    const long long p = parse_integer("MASTER_PORT", *v);
    if (p < 1 || p > 65535) {
      throw ValueError(kOp, "MASTER_PORT=" + quoted(*v) + " is out of range (expected 1..65535)");
    }
    le.master_port = static_cast<int>(p);
  } else {
    le.master_port = kDefaultMasterPort;
  }
  return le;
}

constexpr std::size_t kMaxJobId = 255;
constexpr std::size_t kMinSecret = 16;

std::string trimmed(const std::string& v) {
  std::size_t b = v.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return v.substr(b, v.find_last_not_of(" \t\r\n") - b + 1);
}

void read_job_id(const Env& env, LaunchEnv& le) {
  auto take = [&](const char* name, const std::string& value) {
    const std::string v = trimmed(value);
    if (v.size() > kMaxJobId)
      throw ValueError(kOp, std::string(name) + " is " + std::to_string(v.size()) + " characters long (at most " +
                                std::to_string(kMaxJobId) + ")");
    for (char c : v)
      if (c < 0x21 || c > 0x7e)
        throw ValueError(kOp, std::string(name) + "=" + quoted(value) +
                                  " holds a blank or a character that is not printable ASCII");
    le.job_id = v;
    le.job_id_source = name;
  };
  if (const std::string* v = find(env, "DOPT_JOB_ID")) {
    if (trimmed(*v).empty()) throw ValueError(kOp, "DOPT_JOB_ID is set but empty");
    return take("DOPT_JOB_ID", *v);
  }
  if (const std::string* v = find(env, "TORCHELASTIC_RUN_ID"); v && !trimmed(*v).empty() && trimmed(*v) != "none")
    return take("TORCHELASTIC_RUN_ID", *v);
  for (const char* name : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"})
    if (const std::string* v = find(env, name); v && !trimmed(*v).empty()) return take(name, *v);
  if (const std::string* v = find(env, "SLURM_JOB_ID"); v && !trimmed(*v).empty()) {
    std::string id = trimmed(*v);
    if (const std::string* step = find(env, "SLURM_STEP_ID"); step && !trimmed(*step).empty())
      id += "." + trimmed(*step);
    return take("SLURM_JOB_ID", id);
  }
}

std::string read_secret_file(const std::string& path) {
  const std::string name = "DOPT_SECRET_FILE=" + quoted(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw ValueError(kOp, name + " cannot be opened: " + std::strerror(errno));
  struct stat st {};
  std::string out;
  std::string problem;
  if (::fstat(fd, &st) != 0) problem = std::string("cannot stat it: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) problem = "is not a regular file";
  else if (st.st_uid != ::geteuid()) problem = "belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    problem = std::string("can be read or written by others (mode ") + mode + "): chmod 600 it";
  } else if (st.st_size > 65536) {
    problem = "is larger than 64 KiB";
  } else {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        problem = std::string("cannot be read: ") + std::strerror(errno);
        break;
      }
      if (n == 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  if (!problem.empty()) throw ValueError(kOp, name + " " + problem);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ' || out.back() == '\t'))
    out.pop_back();
  return out;
}

void read_network(const Env& env, LaunchEnv& le) {
  const std::string* file = find(env, "DOPT_SECRET_FILE");
  const std::string* value = find(env, "DOPT_SECRET");
  if (file && value) throw ValueError(kOp, "DOPT_SECRET and DOPT_SECRET_FILE are both set; set one of them");
  if (file) {
    if (file->empty()) throw ValueError(kOp, "DOPT_SECRET_FILE is set but empty");
    le.secret = read_secret_file(*file);
    le.secret_source = "DOPT_SECRET_FILE=" + *file;
  } else if (value) {
    le.secret = *value;
    le.secret_source = "DOPT_SECRET";
  }
  if (!le.secret_source.empty() && le.secret.size() < kMinSecret)
    throw ValueError(kOp, (file ? "the secret in " + le.secret_source : std::string("DOPT_SECRET")) + " is " +
                              std::to_string(le.secret.size()) + " bytes long; use at least " +
                              std::to_string(kMinSecret) + " (e.g. 32 random bytes as hex)");
  const std::string* bind = find(env, "DOPT_BIND_ADDR");
  const std::string* ifname = find(env, "DOPT_SOCKET_IFNAME");
  if (bind && ifname) throw ValueError(kOp, "DOPT_BIND_ADDR and DOPT_SOCKET_IFNAME are both set; set one of them");
  if (bind) {
    le.bind_addr = trimmed(*bind);
    if (le.bind_addr.empty()) throw ValueError(kOp, "DOPT_BIND_ADDR is set but empty");
  }
  if (ifname) {
    le.socket_ifname = trimmed(*ifname);
    if (le.socket_ifname.empty()) throw ValueError(kOp, "DOPT_SOCKET_IFNAME is set but empty");
  }
  if (const std::string* adv = find(env, "DOPT_ADVERTISE_ADDR")) {
    le.advertise_addr = trimmed(*adv);
    if (le.advertise_addr.empty()) throw ValueError(kOp, "DOPT_ADVERTISE_ADDR is set but empty");
  }
  if (const std::string* t = find(env, "DOPT_HANDSHAKE_TIMEOUT_MS")) {
    const long long ms = parse_integer("DOPT_HANDSHAKE_TIMEOUT_MS", *t);
    if (ms < 1 || ms > 24LL * 3600 * 1000)
      throw ValueError(kOp, "DOPT_HANDSHAKE_TIMEOUT_MS=" + quoted(*t) + " is out of range (expected 1..86400000)");
    le.handshake_timeout = std::chrono::milliseconds(ms);
  }
  if (const std::string* r = find(env, "DOPT_PORT_RANGE")) {
    const std::string v = trimmed(*r);
    const auto dash = v.find_first_of("-:");
    if (dash == std::string::npos)
      throw ValueError(kOp, "DOPT_PORT_RANGE=" + quoted(*r) + " is not a range LOW-HIGH (e.g. 29600-29699)");
    const long long lo = parse_integer("DOPT_PORT_RANGE", v.substr(0, dash));
    const long long hi = parse_integer("DOPT_PORT_RANGE", v.substr(dash + 1));
    if (lo < 1 || hi > 65535 || lo > hi)
      throw ValueError(kOp, "DOPT_PORT_RANGE=" + quoted(*r) + " is not a range of ports 1 <= LOW <= HIGH <= 65535");
    le.port_range_lo = static_cast<int>(lo);
    le.port_range_hi = static_cast<int>(hi);
  }
  // torchrun's default (static) rendezvous: its agent's store holds MASTER_PORT.
  if (const std::string* s = find(env, "TORCHELASTIC_USE_AGENT_STORE"); s && trimmed(*s) == "True") {
    le.agent_store = true;
    if (const std::string* c = find(env, "TORCHELASTIC_RESTART_COUNT"); c && !trimmed(*c).empty())
      le.restart_count = static_cast<int>(parse_integer("TORCHELASTIC_RESTART_COUNT", *c));
  }
}

LaunchEnv parse_all(const Env& env, const Family& f) {
  LaunchEnv le = parse_family(env, f);
  read_job_id(env, le);
  read_network(env, le);
  return le;
}

}  // namespace

std::string LaunchEnv::describe_job() const {
  if (job_id.empty()) return "no job id";
  return "job '" + job_id + "' (from " + job_id_source + ")";
}

LaunchEnv parse_launch_env(const std::map<std::string, std::string>& env) {
  for (const Family* f : {&kTorchrun, &kOpenMpi, &kSlurm}) {
    if (present(env, *f)) return parse_all(env, *f);
  }
  throw ValueError(kOp,
                   "no launch contract in the environment: set RANK and WORLD_SIZE (torchrun, dopt-run), "
                   "or launch with OpenMPI's mpirun (OMPI_COMM_WORLD_*) or SLURM's srun (SLURM_PROCID, "
                   "SLURM_NTASKS)");
}

std::optional<LaunchEnv> launch_env_from_environment() {
  const Env env = settings::environment();
  for (const Family* f : {&kTorchrun, &kOpenMpi, &kSlurm}) {
    if (present(env, *f)) return parse_all(env, *f);
  }
  return std::nullopt;
}

}  // namespace dopt
