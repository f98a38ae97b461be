#pragma once
// Hyperparameter values as torch keeps them in a param group dict: numbers,
// flags, pairs (betas, etas, step_sizes) and strings. Integers are doubles,
// like JSON. Ordered by key so that serialisation is deterministic.
#include <concepts>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace dopt {

/// One hyperparameter value: a flag, a number, a list of numbers or a string.
/// A std::variant that also takes integer literals as numbers, so that
/// `{"momentum", 0}` means 0.0 (a plain variant refuses an int: it would
/// narrow to both bool and double).
struct HyperValue : std::variant<bool, double, std::vector<double>, std::string> {
  using Base = std::variant<bool, double, std::vector<double>, std::string>;
  using Base::Base;
  HyperValue() = default;
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  HyperValue(I v) : Base(static_cast<double>(v)) {}  // NOLINT(implicit): integer literals are numbers
};
using Hyperparams = std::map<std::string, HyperValue>;

/// Typed access; throws dopt::TypeError naming `op` and `key` on a kind mismatch
/// and dopt::KeyError when the key is absent.
double hyper_number(const Hyperparams& h, const std::string& key, const char* op);
bool hyper_flag(const Hyperparams& h, const std::string& key, const char* op);
std::vector<double> hyper_pair(const Hyperparams& h, const std::string& key, const char* op);
std::string hyper_string(const Hyperparams& h, const std::string& key, const char* op);
/// JSON text of one value / of a whole map ({"lr": 0.001, "betas": [0.9, 0.999], ...}).
std::string hyper_to_json(const Hyperparams& h);
/// Parses JSON text written by hyper_to_json (or by hand); throws dopt::ValueError.
Hyperparams hyper_from_json(const std::string& json, const char* op);

}  // namespace dopt
