#pragma once
// dopt-run's output (dopt_run.cpp): its own messages ("dopt-run: ...") on
// stderr, and each rank's stdout and stderr written on as whole lines with
// the rank's prefix. Single-threaded: dopt-run's poll loop calls these.
#include <cstddef>
#include <string>

namespace dopt_run {

/// Writes all n bytes to fd (retrying on EINTR); drops them once the reader is gone.
void write_all(int fd, const char* p, std::size_t n);
/// "dopt-run: msg" and a newline on stderr.
void say(const std::string& msg);

/// One output stream (stdout or stderr) of one rank.
struct Stream {
  int fd = -1;      // read end (non-blocking), -1 once closed
  int out_fd = -1;  // where the prefixed lines go
  std::string prefix;
  std::string partial;

  /// Writes prefix + n bytes + newline as one write.
  void emit(const char* p, std::size_t n);
  /// Writes every complete line of what came; a line of 1 MiB or more is cut.
  void consume(const char* p, std::size_t n);
  /// Reads what is available; returns false at end of stream (and closes).
  bool read_some();
  /// Closes the read end and writes a last line without a newline, if any.
  void close_stream();
};

}  // namespace dopt_run
