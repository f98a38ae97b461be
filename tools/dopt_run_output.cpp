// dopt-run's output (dopt_run_output.hpp).
#include "dopt_run_output.hpp"

#include <unistd.h>

#include <cerrno>

namespace dopt_run {

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // EPIPE etc.: the reader is gone, drop the output
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void say(const std::string& msg) {
  const std::string line = "dopt-run: " + msg + "\n";
  write_all(STDERR_FILENO, line.data(), line.size());
}

void Stream::emit(const char* p, std::size_t n) {
  std::string line;
  line.reserve(prefix.size() + n + 1);
  line += prefix;
  line.append(p, n);
  line += '\n';
  write_all(out_fd, line.data(), line.size());
}

void Stream::consume(const char* p, std::size_t n) {
  partial.append(p, n);
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = partial.find('\n', start);
    if (nl == std::string::npos) break;
    emit(partial.data() + start, nl - start);
    start = nl + 1;
  }
  partial.erase(0, start);
  constexpr std::size_t kMaxLine = 1 << 20;  // a line this long is cut
  if (partial.size() >= kMaxLine) {
    emit(partial.data(), partial.size());
    partial.clear();
  }
}

bool Stream::read_some() {
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r > 0) {
      consume(buf, static_cast<std::size_t>(r));
      continue;  // non-blocking: read until EAGAIN
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    close_stream();
    return false;
  }
}

void Stream::close_stream() {
  if (fd >= 0) ::close(fd);
  fd = -1;
  if (!partial.empty()) emit(partial.data(), partial.size());
  partial.clear();
}

}  // namespace dopt_run
