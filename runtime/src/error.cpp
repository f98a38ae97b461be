#include "dopt/runtime/error.hpp"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace dopt {
namespace {
std::string compose(const std::string& op, const std::string& what, std::optional<int> rank) {
  std::string msg = op;
  if (rank) msg += " [rank " + std::to_string(*rank) + "]";
  if (!msg.empty()) msg += ": ";
  msg += what;
  return msg;
}
}  // namespace

std::string errno_text(int e) {
  std::string out = std::strerror(e);
  if (e == EMFILE) {
    rlimit lim{};
    const bool known = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY;
    out += " (this process has no free file descriptor: its limit, ulimit -n, is " +
           (known ? std::to_string(lim.rlim_cur) : std::string("unknown")) + ")";
  } else if (e == ENFILE) {
    out += " (the system has no free file descriptor: see /proc/sys/fs/file-max)";
  } else if (e == ENOMEM) {
    out += " (this process is out of memory)";
  }
  return out;
}

Error::Error(std::string op, std::string what, std::optional<int> rank)
    : std::runtime_error(compose(op, what, rank)),
      op_(std::move(op)),
      detail_(std::move(what)),
      rank_(rank) {}

}  // namespace dopt
