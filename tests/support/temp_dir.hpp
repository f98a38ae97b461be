#pragma once
// Temporary folders for the tests: unique to this process, under the
// system's temp dir, removed when the test is done with them.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace dopt::testing {

/// A fresh folder under the temp dir ("<prefix>-<pid>-<name>"), removed by the
/// destructor. Any thread may make one; the test that made it owns it.
struct TempDir {
  std::filesystem::path path;
  TempDir(const std::string& prefix, const std::string& name) {
    path = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace dopt::testing
