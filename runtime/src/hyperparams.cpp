#include "dopt/runtime/hyperparams.hpp"

#include <nlohmann/json.hpp>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/json_object.hpp"

namespace dopt {
namespace {
const HyperValue& find(const Hyperparams& h, const std::string& key, const char* op) {
  auto it = h.find(key);
  if (it == h.end()) throw KeyError(op, "missing hyperparameter '" + key + "'");
  return it->second;
}
[[noreturn]] void kind_error(const std::string& key, const char* op, const char* want) {
  throw TypeError(op, "hyperparameter '" + key + "' must be " + want);
}
}  // namespace

double hyper_number(const Hyperparams& h, const std::string& key, const char* op) {
  const auto& v = find(h, key, op);
  if (auto* d = std::get_if<double>(&v)) return *d;
  kind_error(key, op, "a number");
}
bool hyper_flag(const Hyperparams& h, const std::string& key, const char* op) {
  const auto& v = find(h, key, op);
  if (auto* b = std::get_if<bool>(&v)) return *b;
  kind_error(key, op, "true or false");
}
std::vector<double> hyper_pair(const Hyperparams& h, const std::string& key, const char* op) {
  const auto& v = find(h, key, op);
  if (auto* p = std::get_if<std::vector<double>>(&v)) {
    if (p->size() != 2) kind_error(key, op, "a pair of two numbers");
    return *p;
  }
  kind_error(key, op, "a pair of two numbers");
}
std::string hyper_string(const Hyperparams& h, const std::string& key, const char* op) {
  const auto& v = find(h, key, op);
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  kind_error(key, op, "a string");
}

std::string hyper_to_json(const Hyperparams& h) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& entry : h) {  // not a structured binding: clang 14 cannot capture one in a lambda
    const std::string& k = entry.first;
    std::visit([&](const auto& x) { j[k] = x; }, entry.second);
  }
  return j.dump();
}

Hyperparams hyper_from_json(const std::string& text, const char* op) {
  const nlohmann::json j =
      parse_json_object(text, op, "hyperparameters are not valid JSON: ", "hyperparameters must be a JSON object");
  Hyperparams h;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto& v = it.value();
    if (v.is_boolean()) h[it.key()] = v.get<bool>();
    else if (v.is_number()) h[it.key()] = v.get<double>();
    else if (v.is_string()) h[it.key()] = v.get<std::string>();
    else if (v.is_array()) {
      std::vector<double> xs;
      for (const auto& e : v) {
        if (!e.is_number()) throw ValueError(op, "hyperparameter '" + it.key() + "' has a non-number element");
        xs.push_back(e.get<double>());
      }
      h[it.key()] = std::move(xs);
    } else {
      throw ValueError(op, "hyperparameter '" + it.key() + "' has an unsupported JSON type");
    }
  }
  return h;
}

}  // namespace dopt
