#include "dopt/runtime/internal/json_object.hpp"

#include "dopt/runtime/error.hpp"

namespace dopt {

nlohmann::json parse_json_object(const std::string& text, const char* op, const std::string& invalid,
                                 const std::string& not_object) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw ValueError(op, invalid + e.what());
  }
  if (!j.is_object()) throw ValueError(op, not_object);
  return j;
}

}  // namespace dopt
