// Which ranks are on the same host, measured (host_identity.hpp).
#include "core/host_identity.hpp"
#include "dopt/runtime/settings.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "dopt/runtime/error.hpp"

namespace dopt::detail {

namespace {

std::string boot_id() {
  std::string boot;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) boot = buf;
    std::fclose(f);
  }
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  return boot.empty() ? "noboot" : boot;
}

std::string random_hex(int words) {
  std::random_device rd;
  std::string out;
  char buf[9];
  for (int i = 0; i < words; ++i) {
    std::snprintf(buf, sizeof buf, "%08x", rd());
    out += buf;
  }
  return out;
}

constexpr std::size_t kTokenBytes = 32;

}  // namespace

std::string network_namespace_id() {
  struct stat st {};
  if (::stat("/proc/self/ns/net", &st) != 0) return boot_id() + ":?";
  return boot_id() + ":" + std::to_string(static_cast<unsigned long long>(st.st_ino));
}

std::string shared_memory_id() {
  struct stat st {};
  if (::stat("/dev/shm", &st) != 0) return boot_id() + ":noshm-" + random_hex(2);  // nobody shares it
  return boot_id() + ":" + std::to_string(major(st.st_dev)) + "." + std::to_string(minor(st.st_dev));
}

HostIdentity::HostIdentity() {
  if (const auto id = settings::text("DOPT_HOST_ID")) {
    overridden_ = true;
    host_ = "host=" + *id;
    return;
  }
  host_ = "host=" + shared_memory_id();
  token_ = random_hex(4);
  probe_name_ = "/dopt-" + std::to_string(::getpid()) + "-probe-" + random_hex(2);
  const int fd = ::shm_open(probe_name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {  // no usable /dev/shm: this rank shares it with nobody
    host_ = "host=" + boot_id() + ":noshm-" + random_hex(2);
    probe_name_.clear();
    return;
  }
  bool ok = ::ftruncate(fd, kTokenBytes) == 0;
  if (ok) ok = ::pwrite(fd, token_.data(), token_.size(), 0) == static_cast<ssize_t>(token_.size());
  ::close(fd);
  if (!ok) {
    ::shm_unlink(probe_name_.c_str());
    host_ = "host=" + boot_id() + ":noshm-" + random_hex(2);
    probe_name_.clear();
  }
}

HostIdentity::~HostIdentity() { release(); }

std::string HostIdentity::probe_fields() const {
  if (overridden_ || probe_name_.empty()) return {};
  return " probe=" + probe_name_ + ":" + token_;
}

void HostIdentity::verify(const std::vector<std::string>& infos, int rank, const char* op) const {
  if (overridden_) return;
  for (std::size_t r = 0; r < infos.size(); ++r) {
    if (static_cast<int>(r) == rank || infos[r].rfind(host_ + " ", 0) != 0) continue;
    const auto p = infos[r].find(" probe=");
    std::string why;
    if (p == std::string::npos) {
      why = "it sent no probe segment";
    } else {
      const std::string field = infos[r].substr(p + 7, infos[r].find(' ', p + 7) - (p + 7));
      const auto colon = field.rfind(':');
      const std::string name = field.substr(0, colon), token = colon == std::string::npos ? "" : field.substr(colon + 1);
      const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
      if (fd < 0) {
        why = "cannot open its segment " + name + ": " + std::strerror(errno);
      } else {
        void* m = ::mmap(nullptr, kTokenBytes, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) why = "cannot map its segment " + name + ": " + std::strerror(errno);
        else if (std::memcmp(m, token.data(), std::min(token.size(), kTokenBytes)) != 0 || token.size() != kTokenBytes)
          why = "its segment " + name + " holds another token (a different /dev/shm under the same name?)";
        if (m != MAP_FAILED) ::munmap(m, kTokenBytes);
        ::close(fd);
      }
    }
    if (!why.empty())
      throw ValueError(op, "rank " + std::to_string(r) + " looks like it is on this host (same kernel and /dev/shm) " +
                               "but this rank cannot share memory with it: " + why +
                               " (ranks of different users? set DOPT_HOST_ID to a distinct value per host, or "
                               "DOPT_TRANSPORT=tcp)", rank);
  }
}

void HostIdentity::release() noexcept {
  if (!probe_name_.empty()) ::shm_unlink(probe_name_.c_str());
  probe_name_.clear();
}

}  // namespace dopt::detail
