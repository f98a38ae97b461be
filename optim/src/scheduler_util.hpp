#pragma once
// Internal helpers of the learning-rate schedulers: reading and writing
// their state dicts, Python's integer arithmetic.
#include <memory>
#include <string>
#include <vector>

#include "dopt/optim/lr_scheduler.hpp"

namespace dopt::optim::detail {

/// Python's a // b (floor division) for b > 0.
inline std::int64_t py_floordiv(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

inline void check_class(const SchedulerStateDict& sd, const std::string& name, const std::string& op) {
  auto it = sd.find("_class");
  if (it == sd.end()) return;  // a dict without the marker (hand-made): trust it
  const auto* s = std::get_if<std::string>(&it->second);
  if (!s || *s != name)
    throw StateDictError(op, "the state dict is of " + (s ? *s : std::string("an unknown class")) + ", not " + name);
}

inline double sd_number(const SchedulerStateDict& sd, const char* key, const std::string& op) {
  return hyper_number(sd, key, op.c_str());
}

inline std::int64_t sd_int(const SchedulerStateDict& sd, const char* key, const std::string& op) {
  const double v = sd_number(sd, key, op);
  if (v != static_cast<double>(static_cast<std::int64_t>(v)))
    throw StateDictError(op, std::string("'") + key + "' must be an integer");
  return static_cast<std::int64_t>(v);
}

inline bool sd_flag(const SchedulerStateDict& sd, const char* key, const std::string& op) {
  return hyper_flag(sd, key, op.c_str());
}

inline std::string sd_string(const SchedulerStateDict& sd, const char* key, const std::string& op) {
  return hyper_string(sd, key, op.c_str());
}

/// A list entry; `size` checked unless SIZE_MAX.
inline std::vector<double> sd_list(const SchedulerStateDict& sd, const char* key, const std::string& op,
                                   std::size_t size = static_cast<std::size_t>(-1)) {
  auto it = sd.find(key);
  if (it == sd.end()) throw KeyError(op, std::string("missing entry '") + key + "'");
  const auto* v = std::get_if<std::vector<double>>(&it->second);
  if (!v) throw StateDictError(op, std::string("'") + key + "' must be a list of numbers");
  if (size != static_cast<std::size_t>(-1) && v->size() != size)
    throw StateDictError(op, std::string("'") + key + "' has " + std::to_string(v->size()) + " values for " +
                                 std::to_string(size) + " param groups");
  return *v;
}

inline std::vector<std::int64_t> sd_ints(const SchedulerStateDict& sd, const char* key, const std::string& op) {
  std::vector<std::int64_t> out;
  for (double d : sd_list(sd, key, op)) {
    if (d != static_cast<double>(static_cast<std::int64_t>(d)))
      throw StateDictError(op, std::string("'") + key + "' must hold integers");
    out.push_back(static_cast<std::int64_t>(d));
  }
  return out;
}

inline std::vector<double> to_doubles(const std::vector<std::int64_t>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline std::string child_prefix(std::size_t i) { return "_schedulers." + std::to_string(i) + "."; }

inline void put_children(SchedulerStateDict& sd, const std::vector<std::unique_ptr<LRScheduler>>& children) {
  sd["_schedulers"] = static_cast<double>(children.size());
  for (std::size_t i = 0; i < children.size(); ++i)
    for (const auto& [k, v] : children[i]->state_dict()) sd[child_prefix(i) + k] = v;
}

/// Loads every child's entries; on any error every child is restored.
inline void load_children(const SchedulerStateDict& sd, const std::vector<std::unique_ptr<LRScheduler>>& children,
                          const std::string& op) {
  if (sd_int(sd, "_schedulers", op) != static_cast<std::int64_t>(children.size()))
    throw StateDictError(op, "the dict has " + std::to_string(sd_int(sd, "_schedulers", op)) +
                                 " child schedulers, this scheduler " + std::to_string(children.size()));
  std::vector<SchedulerStateDict> parts(children.size()), backup;
  for (const auto& [k, v] : sd) {
    if (k.rfind("_schedulers.", 0) != 0) continue;
    const auto dot = k.find('.', 12);
    if (dot == std::string::npos) continue;
    std::size_t i = 0;
    try {
      i = std::stoul(k.substr(12, dot - 12));
    } catch (const std::exception&) {
      throw StateDictError(op, "bad child key '" + k + "'");
    }
    if (i >= children.size()) throw StateDictError(op, "child key '" + k + "' names no child");
    parts[i][k.substr(dot + 1)] = v;
  }
  for (const auto& c : children) backup.push_back(c->state_dict());
  try {
    for (std::size_t i = 0; i < children.size(); ++i) children[i]->load_state_dict(parts[i]);
  } catch (...) {
    for (std::size_t i = 0; i < children.size(); ++i) children[i]->load_state_dict(backup[i]);
    throw;
  }
}

}  // namespace dopt::optim::detail
