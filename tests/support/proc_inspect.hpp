#pragma once
// What the multi-process tests learn about running processes from /proc:
// their children, the TCP ports they listen on, their environment. Any
// thread; nothing here waits. (Knocking on a port: ports.hpp.)
#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "text.hpp"

namespace dopt::testing {

/// The processes whose parent is `pid`.
inline std::vector<int> children_of(int pid) {
  std::vector<int> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const int p = std::atoi(e->d_name);
    if (p <= 0) continue;
    const std::string stat = slurp("/proc/" + std::to_string(p) + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream ss(stat.substr(close + 2));
    char state;
    int ppid = 0;
    ss >> state >> ppid;
    if (ppid == pid) out.push_back(p);
  }
  ::closedir(d);
  return out;
}

struct ListenSocket {
  std::string addr_hex;  // as /proc/net/tcp writes the local address ("0100007F" = 127.0.0.1)
  int port = 0;
};

/// The TCP sockets process `pid` listens on.
inline std::vector<ListenSocket> listening(int pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(fd_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char buf[256] = {};
      const ssize_t n = ::readlink((fd_dir + "/" + e->d_name).c_str(), buf, sizeof buf - 1);
      if (n > 0 && std::string(buf).rfind("socket:[", 0) == 0)
        inodes.insert(std::string(buf + 8, static_cast<std::size_t>(n) - 9));
    }
    ::closedir(d);
  }
  std::vector<ListenSocket> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    const auto rows = lines_of(slurp(table));
    for (std::size_t i = 1; i < rows.size(); ++i) {
      std::istringstream ss(rows[i]);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (st != "0A" || !inodes.count(inode)) continue;
      const auto colon = local.find(':');
      out.push_back({local.substr(0, colon), std::stoi(local.substr(colon + 1), nullptr, 16)});
    }
  }
  return out;
}

inline std::string env_of(int pid, const std::string& key) {
  const std::string all = slurp("/proc/" + std::to_string(pid) + "/environ");
  std::size_t at = 0;
  while (at < all.size()) {
    const std::size_t end = all.find('\0', at);
    const std::string kv = all.substr(at, end - at);
    if (kv.rfind(key + "=", 0) == 0) return kv.substr(key.size() + 1);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return {};
}

}  // namespace dopt::testing
