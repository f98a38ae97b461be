#pragma once
// What the multi-process tests do with the text a program printed or wrote:
// read a file whole, split it into lines, look for a piece of it.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace dopt::testing {

/// The whole file ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) lines.push_back(line);
  return lines;
}

inline bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace dopt::testing
