// The process-wide registry of RPC functions and methods (rpc.hpp:
// register_function, register_method).
#include "rpc/core.hpp"

namespace dopt::rpc {
namespace detail {

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::shared_ptr<const FunctionEntry>>& registry() {
  static std::map<std::string, std::shared_ptr<const FunctionEntry>> r;
  return r;
}
}  // namespace

std::shared_ptr<const FunctionEntry> find_function(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}

void register_entry(const std::string& name, FunctionEntry entry) {
  if (name.empty()) throw ValueError("rpc.register_function", "the name is empty");
  if (name.rfind("__", 0) == 0)
    throw ValueError("rpc.register_function", "names starting with '__' are reserved, got '" + name + "'");
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = std::make_shared<const FunctionEntry>(std::move(entry));
}

}  // namespace detail

bool is_registered(const std::string& name) { return detail::find_function(name) != nullptr; }

}  // namespace dopt::rpc
