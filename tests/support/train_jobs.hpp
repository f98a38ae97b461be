#pragma once
// dopt-train jobs for the end-to-end tests (tests/train*.test.cpp): the
// program of this build, the environment a job started from a test gets
// (the test's own RANK / WORLD_SIZE unset), and the losses it wrote with
// --metrics. On the test thread, after the job ended.
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "processes.hpp"
#include "text.hpp"

namespace dopt::testing {

#ifdef DOPT_BINARY_DIR
inline const std::string kDoptTrain = tool_path("dopt-train");
#endif
inline const std::map<std::string, std::string> kTrainEnv{
    {"DOPT_TIMEOUT_MS", "30000"}, {"RANK", ""}, {"WORLD_SIZE", ""}};

/// (step, loss) of every line of a --metrics file.
inline std::vector<std::pair<long, double>> losses(const std::filesystem::path& metrics) {
  std::vector<std::pair<long, double>> out;
  for (const std::string& line : lines_of(slurp(metrics.string()))) {
    const auto j = nlohmann::json::parse(line);
    out.emplace_back(j.at("step").get<long>(), j.at("loss").get<double>());
  }
  return out;
}

}  // namespace dopt::testing
