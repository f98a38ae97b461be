#pragma once
// Internal (not installed): reading a JSON document that must be one object
// (the hyperparameters' JSON, OptimizerSpec::from_json).
#include <string>

#include <nlohmann/json.hpp>

namespace dopt {

/// The JSON object in text. Throws dopt::ValueError naming op: `invalid`
/// followed by the parser's message when text is not JSON, `not_object` when
/// it is JSON but not an object.
nlohmann::json parse_json_object(const std::string& text, const char* op, const std::string& invalid,
                                 const std::string& not_object);

}  // namespace dopt
