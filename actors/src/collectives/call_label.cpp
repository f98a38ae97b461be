#include "dopt/actors/internal/call_label.hpp"
#include "sim/task_locals.hpp"

#include <utility>

namespace dopt::detail {

namespace {

thread_local const char* t_call = nullptr;

}  // namespace

CallScope::CallScope(const char* label) noexcept {
  if (t_call || !label) return;
  t_call = label;
  named_ = true;
}

CallScope::~CallScope() {
  if (named_) t_call = nullptr;
}

const char* current_call() noexcept { return t_call; }

const char* exchange_call_label(const char* v) noexcept { return std::exchange(t_call, v); }

std::string calls_by_rank(const std::vector<std::pair<int, std::string>>& calls) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in order of first appearance
  for (const auto& [rank, label] : calls) {
    const std::string name = label.empty() ? "an unnamed call" : label;
    auto it = groups.begin();
    while (it != groups.end() && it->first != name) ++it;
    if (it == groups.end()) groups.push_back({name, {rank}});
    else it->second.push_back(rank);
  }
  std::string s;
  for (const auto& [name, ranks] : groups) {
    if (!s.empty()) s += "; ";
    s += name + (ranks.size() == 1 ? " on rank " : " on ranks ");
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return s;
}

std::string mismatch_text(const std::vector<std::pair<int, std::string>>& calls, const std::string& internal) {
  return calls_by_rank(calls) + "; internally: " + internal;
}

}  // namespace dopt::detail
