// dopt-run's nodes: --nnodes, and the probes of ports on them (dopt_run_nodes.hpp).
#include "dopt_run_nodes.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <string_view>

#include <CLI/CLI.hpp>

namespace dopt_run {

int pick_free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(s);
  return port;
}

/// Whether every address of host:port refuses a TCP connection (nothing
/// listens there), each tried for up to 1 s; false when one accepts, does not
/// answer or the name does not resolve. A connection closed before a byte is
/// not reported by dopt's listeners (auth_listener.cpp).
bool refuses_connections(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list) != 0) return false;
  bool refused = list != nullptr;
  for (addrinfo* a = list; a && refused; a = a->ai_next) {
    const int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (s < 0) {
      refused = false;
      break;
    }
    int err = ::connect(s, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    pollfd p{s, POLLOUT, 0};
    if (err == EINPROGRESS) {
      socklen_t len = sizeof err;
      err = ::poll(&p, 1, 1000) == 1 && ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 ? err : ETIMEDOUT;
    }
    ::close(s);
    refused = err == ECONNREFUSED;
  }
  ::freeaddrinfo(list);
  return refused;
}

NodeCount parse_nnodes(const std::string& text, const std::string& on_failure) {
  NodeCount cfg;
  auto number = [&](std::string_view part, const char* what) {
    int v = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec == std::errc::result_out_of_range)
      throw CLI::ValidationError("--nnodes", "--nnodes " + text + ": " + what + " is too large");
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || v < 1)
      throw CLI::ValidationError("--nnodes", "--nnodes " + text + ": " + what + " must be a whole number >= 1");
    return v;
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    cfg.max = cfg.min = number(text, "M");
    return cfg;
  }
  cfg.min = number(std::string_view(text).substr(0, colon), "MIN");
  cfg.max = number(std::string_view(text).substr(colon + 1), "MAX");
  if (cfg.min > cfg.max)
    throw CLI::ValidationError("--nnodes", "--nnodes " + text + ": MIN " + std::to_string(cfg.min) +
                                               " is larger than MAX " + std::to_string(cfg.max));
  if (cfg.min < cfg.max && on_failure == "stop")
    throw CLI::ValidationError(
        "--nnodes", "--nnodes " + text +
                        " needs --on-failure continue or replace: the job starts without the ranks of node" +
                        (cfg.max - cfg.min == 1 ? " " + std::to_string(cfg.min)
                                                          : "s " + std::to_string(cfg.min) + ".." +
                                                                std::to_string(cfg.max - 1)) +
                        " (their slots are lost from the start), so its program must go on without them and grow() "
                        "when they join (dopt-train --survive --optim zero does); with --on-failure stop nothing "
                        "says it can");
  return cfg;
}

}  // namespace dopt_run
