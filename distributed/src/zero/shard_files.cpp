// Sharded checkpoint files (shard_files.hpp): one per rank, written
// together; a folder's world size found from the names.
#include "zero/shard_files.hpp"

#include <exception>
#include <filesystem>
#include <map>
#include <set>

#include "dopt/runtime/error.hpp"

namespace dopt::optim::zero_detail {

namespace fs = std::filesystem;

void save_shard_everywhere(ProcessGroup group, const StateDict& sd, const std::string& dir, const std::string& file,
                           const std::string& op, int rank) {
  std::exception_ptr failure;
  try {
    fs::create_directories(dir);
    save_state_dict(sd, (fs::path(dir) / file).string());
  } catch (...) {
    failure = std::current_exception();
  }
  Tensor failed = Tensor::full({1}, failure ? 1.0 : 0.0, DType::int64);
  group.all_reduce(failed, ReduceOp::sum);
  if (failure) std::rethrow_exception(failure);
  const auto n = failed.data<std::int64_t>()[0];
  if (n > 0)
    throw IOError(
        op, std::to_string(n) + " rank(s) failed to write their shard under " + dir + "; the checkpoint is incomplete",
        rank);
}

int shard_world_size(const std::string& dir, const std::regex& re, const std::string& pattern,
                     std::string (*name)(int, int), const std::string& op, int rank) {
  if (!fs::is_directory(dir)) throw IOError(op, dir + ": not a directory", rank);
  std::map<int, std::set<int>> found;  // world size -> ranks
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (std::regex_match(file, m, re)) found[std::stoi(m[2].str())].insert(std::stoi(m[1].str()));
  }
  if (found.empty()) throw IOError(op, dir + ": no shard files " + pattern, rank);
  if (found.size() > 1) {
    std::string sizes;
    for (const auto& [n, rs] : found) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
    throw IOError(op, dir + ": shards of several world sizes (" + sizes + "); keep one checkpoint per folder", rank);
  }
  const int n = found.begin()->first;
  for (int r = 0; r < n; ++r)
    if (!found.begin()->second.count(r)) throw IOError(op, dir + ": missing shard " + name(r, n), rank);
  return n;
}

}  // namespace dopt::optim::zero_detail
