#pragma once
// Temporary TCP ports for the tests: a listening socket on an ephemeral port,
// a port free right now, and a knock on a loopback port (connect, send,
// see whether the other side hangs up).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

namespace dopt::testing {

/// A socket listening on INADDR_ANY at an ephemeral port; closed by the
/// destructor. Made on the test thread (it REQUIREs).
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = 0;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
};

/// A port nobody listens on right now (bound to port 0, then closed).
inline int free_port() {
  Listener l;
  return l.port;
}

/// A connection to 127.0.0.1:port whose reads give up after 5 s; -1 when
/// nothing listens there.
inline int connect_loopback(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return -1;
  }
  timeval tv{5, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return s;
}

/// Sends `bytes` on s and reads until the other side closes; true when it
/// did within 5 s (s is closed either way).
inline bool closed_after_sending(int s, const std::string& bytes) {
  (void)::send(s, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  char buf[1024];
  ssize_t n;
  while ((n = ::recv(s, buf, sizeof buf, 0)) > 0) {
  }
  ::close(s);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

}  // namespace dopt::testing
