#include "dopt/runtime/state_dict.hpp"

#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/notice.hpp"
#include "dopt/runtime/safetensors.hpp"

namespace dopt {
namespace {

using json = nlohmann::json;

constexpr const char* kFormatKey = "dopt.format";
constexpr const char* kGroupsKey = "dopt.param_groups";
constexpr const char* kSaveOp = "save_state_dict";
constexpr const char* kLoadOp = "load_state_dict";

[[noreturn]] void bad(const std::string& what, const std::string& problem) {
  throw StateDictError(kLoadOp, what + ": " + problem);
}

/// Parses "state.{index}.{key}"; index is decimal digits (no sign), key non-empty.
bool parse_entry_name(const std::string& name, std::int64_t& index, std::string& key) {
  static const std::string prefix = "state.";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  std::size_t pos = prefix.size();
  std::size_t digits_end = pos;
  while (digits_end < name.size() && name[digits_end] >= '0' && name[digits_end] <= '9') ++digits_end;
  if (digits_end == pos || digits_end - pos > 18) return false;  // 18 digits always fit in int64
  if (digits_end >= name.size() || name[digits_end] != '.') return false;
  if (digits_end + 1 >= name.size()) return false;
  index = std::stoll(name.substr(pos, digits_end - pos));
  key = name.substr(digits_end + 1);
  return true;
}

}  // namespace

SafetensorsFile state_dict_to_safetensors(const StateDict& sd) {
  SafetensorsFile out;
  for (const auto& [index, st] : sd.state) {
    if (index < 0) throw StateDictError(kSaveOp, "negative parameter index " + std::to_string(index));
    for (const auto& [key, t] : st) {
      if (key.empty())
        throw StateDictError(kSaveOp, "parameter " + std::to_string(index) + " has a state entry with an empty key");
      if (!t.defined())
        throw StateDictError(kSaveOp, "state entry '" + key + "' of parameter " + std::to_string(index) +
                                          " is an undefined tensor");
      out.tensors.emplace("state." + std::to_string(index) + "." + key, t);
    }
  }
  json groups = json::array();
  for (std::size_t gi = 0; gi < sd.param_groups.size(); ++gi) {
    const auto& g = sd.param_groups[gi];
    if (g.hyperparams.count("params"))
      throw StateDictError(kSaveOp, "param group " + std::to_string(gi) + " has a hyperparameter named 'params'");
    try {
      json jg = json::parse(hyper_to_json(g.hyperparams));
      jg["params"] = g.params;
      groups.push_back(std::move(jg));
    } catch (const json::exception& e) {
      throw StateDictError(kSaveOp, "cannot encode param group " + std::to_string(gi) + ": " + e.what());
    }
  }
  for (const auto& [k, v] : sd.metadata) {
    if (k == kFormatKey || k == kGroupsKey)
      throw StateDictError(kSaveOp, "metadata key '" + k + "' is reserved");
    out.metadata.emplace(k, v);
  }
  out.metadata[kFormatKey] = kStateDictFormat;
  try {
    out.metadata[kGroupsKey] = groups.dump();
  } catch (const json::exception& e) {
    throw StateDictError(kSaveOp, std::string("cannot encode the param groups: ") + e.what());
  }
  return out;
}

StateDict state_dict_from_safetensors(const SafetensorsFile& file, const std::string& what) {
  auto fmt = file.metadata.find(kFormatKey);
  if (fmt == file.metadata.end())
    bad(what, "not a dopt state file (no '" + std::string(kFormatKey) + "' in the metadata)");
  if (fmt->second != kStateDictFormat)
    bad(what, "unsupported state format '" + fmt->second + "' (expected '" + kStateDictFormat + "')");
  auto gtext = file.metadata.find(kGroupsKey);
  if (gtext == file.metadata.end()) bad(what, "no '" + std::string(kGroupsKey) + "' in the metadata");

  StateDict sd;
  json groups;
  try {
    groups = json::parse(gtext->second);
  } catch (const json::exception& e) {
    bad(what, std::string(kGroupsKey) + " is not valid JSON: " + e.what());
  }
  if (!groups.is_array()) bad(what, std::string(kGroupsKey) + " must be a JSON array");
  std::set<std::int64_t> listed;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    json g = groups[gi];
    const std::string where = "param group " + std::to_string(gi);
    if (!g.is_object()) bad(what, where + " is not a JSON object");
    auto p = g.find("params");
    if (p == g.end()) bad(what, where + " has no 'params'");
    if (!p->is_array()) bad(what, where + ": 'params' must be an array of indices");
    StateDict::Group out;
    for (const auto& idx : *p) {
      if (!idx.is_number_integer() || !idx.is_number_unsigned() ||
          idx.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        bad(what, where + ": parameter index " + idx.dump() + " is not a non-negative integer");
      const auto i = static_cast<std::int64_t>(idx.get<std::uint64_t>());
      if (!listed.insert(i).second) bad(what, "parameter index " + std::to_string(i) + " is listed twice");
      out.params.push_back(i);
    }
    g.erase("params");
    try {
      out.hyperparams = hyper_from_json(g.dump(), kLoadOp);
    } catch (const Error& e) {
      bad(what, where + ": " + e.detail());
    }
    sd.param_groups.push_back(std::move(out));
  }
  for (const auto& [name, t] : file.tensors) {
    std::int64_t index = 0;
    std::string key;
    if (!parse_entry_name(name, index, key))
      bad(what, "unexpected tensor '" + name + "' (expected 'state.{index}.{key}')");
    if (!listed.count(index))
      bad(what, "tensor '" + name + "' holds state of parameter " + std::to_string(index) +
                    ", which no param group lists");
    sd.state[index][key] = t;
  }
  for (const auto& [k, v] : file.metadata)
    if (k != kFormatKey && k != kGroupsKey) sd.metadata.emplace(k, v);
  return sd;
}

void save_state_dict(const StateDict& sd, const std::string& path) {
  SafetensorsFile f = state_dict_to_safetensors(sd);
  write_safetensors(path, f.tensors, f.metadata);
}

StateDict load_state_dict(const std::string& path) {
  SafetensorsFile f = read_safetensors(path);
  if (!f.has_checksums)
    notice_once(path + " has no checksums (written by an older dopt or another program): it is loaded without "
                       "verifying its bytes");
  return state_dict_from_safetensors(f, path);
}

}  // namespace dopt
