#pragma once
// The job's secret that dopt-run makes on one node (dopt_run.cpp; docs/launching.md, "Who may join").
#include <cstddef>
#include <string>

namespace dopt_run {

/// `bytes` random bytes (getrandom) as lowercase hex; std::runtime_error when getrandom fails.
std::string random_hex(std::size_t bytes);

/// A fresh random secret (64 hex digits) in a new folder under $TMPDIR (or
/// /tmp) only this user can enter (0700, the file 0600); the destructor
/// removes both. Throws std::runtime_error naming the path that failed.
class SecretFile {
 public:
  SecretFile();
  ~SecretFile();
  SecretFile(const SecretFile&) = delete;
  SecretFile& operator=(const SecretFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

}  // namespace dopt_run
