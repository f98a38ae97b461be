// What a newcomer must share with the running job (see compatibility.hpp).
#include "core/compatibility.hpp"

#include <map>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/settings.hpp"

namespace dopt::detail {

namespace {

/// The launch facts, each with what sets it (dopt-run's flags; torchrun's are alike).
const std::map<std::string, std::string>& launch_facts() {
  static const std::map<std::string, std::string> facts = {
      {"WORLD_SIZE", "dopt-run --nproc-per-node times --nnodes (MAX)"},
      {"LOCAL_WORLD_SIZE", "dopt-run --nproc-per-node"},
      {"DOPT_MIN_WORLD_SIZE", "dopt-run --nproc-per-node times --nnodes MIN"},
  };
  return facts;
}

std::map<std::string, std::string> as_map(const std::vector<std::string>& items) {
  std::map<std::string, std::string> out;
  for (std::size_t i = 0; i + 1 < items.size(); i += 2) out[items[i]] = items[i + 1];
  return out;
}

}  // namespace

std::vector<std::string> compatibility_items(const LaunchEnv& env, const InitOptions& options, const char* op) {
  const long long min_world = settings::integer("DOPT_MIN_WORLD_SIZE").value_or(env.world_size);
  std::vector<std::string> items = {"WORLD_SIZE",          std::to_string(env.world_size),
                                    "LOCAL_WORLD_SIZE",    std::to_string(env.local_world_size),
                                    "DOPT_MIN_WORLD_SIZE", std::to_string(min_world)};
  for (const auto& [key, value] : options.compatibility) {
    if (key.empty())
      throw ValueError(op, "InitOptions::compatibility has an empty key (its value: '" + value + "')", env.rank);
    if (launch_facts().count(key))
      throw ValueError(op,
                       "InitOptions::compatibility declares " + key +
                           ", which dopt compares itself (a launch fact); name the program's item otherwise",
                       env.rank);
    items.push_back(key);
    items.push_back(value);
  }
  return items;
}

std::string compatibility_differences(const std::vector<std::string>& job, const std::vector<std::string>& newcomer,
                                      const std::string& newcomer_name) {
  const auto ours = as_map(job), theirs = as_map(newcomer);
  // A job that declares no items of its own holds a newcomer to the launch facts only.
  bool job_declares = false;
  for (const auto& [k, v] : ours) job_declares = job_declares || !launch_facts().count(k);
  std::map<std::string, bool> keys;
  for (const auto& [k, v] : ours) keys[k] = true;
  for (const auto& [k, v] : theirs)
    if (job_declares || launch_facts().count(k)) keys[k] = true;
  const std::string lacks = "(not declared)";
  std::string out;
  for (const auto& [key, unused] : keys) {
    const auto a = ours.find(key), b = theirs.find(key);
    const std::string job_value = a == ours.end() ? lacks : a->second;
    const std::string its_value = b == theirs.end() ? lacks : b->second;
    if (a != ours.end() && b != theirs.end() && job_value == its_value) continue;
    const auto fact = launch_facts().find(key);
    const std::string name = fact == launch_facts().end() ? key : key + " (" + fact->second + ")";
    out += (out.empty() ? "" : "; ") + name + ": the job has " + job_value + ", " + newcomer_name + " " + its_value;
  }
  return out;
}

}  // namespace dopt::detail
