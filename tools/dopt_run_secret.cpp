// The job's secret that dopt-run makes (dopt_run_secret.hpp).
#include "dopt_run_secret.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace dopt_run {

std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> b(bytes);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(b.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) out += digits[c >> 4], out += digits[c & 15];
  return out;
}

SecretFile::SecretFile() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/dopt-run-XXXXXX";
  if (!::mkdtemp(templ.data())) throw std::runtime_error("cannot create a folder for the job's secret in " + templ +
                                                         ": " + std::strerror(errno));
  dir_ = templ;
  path_ = dir_ + "/secret";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot create " + path_ + ": " + std::strerror(errno));
  const std::string secret = random_hex(32);
  const bool ok = ::write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size());
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write " + path_ + ": " + std::strerror(errno));
}

SecretFile::~SecretFile() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace dopt_run
