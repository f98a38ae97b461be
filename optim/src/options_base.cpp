#include "dopt/optim/options_base.hpp"

#include "optim_extra.hpp"

namespace dopt::optim {

void OptionsFields::check_known_keys(const Hyperparams& h, const std::vector<const char*>& known, const std::string& op) {
  for (const auto& [k, v] : h) {
    bool ok = false;
    for (const char* name : known) ok = ok || k == name;
    if (!ok) {
      std::string list;
      for (const char* name : known) list += std::string(list.empty() ? "" : ", ") + name;
      throw ValueError(op, "unknown hyperparameter '" + k + "' (known: " + list + ")");
    }
  }
}

void OptionsFields::no_fields(const char* type) {
  throw StateError("OptionsCRTP", std::string("options type ") + type +
                                      " has no fields() and does not override to_hyperparams / set_hyperparams");
}

void OptionsFields::from_hyper(const Hyperparams& h, const char* key, const char* op, double& out) { out = hyper_number(h, key, op); }
void OptionsFields::from_hyper(const Hyperparams& h, const char* key, const char* op, bool& out) { out = hyper_flag(h, key, op); }
void OptionsFields::from_hyper(const Hyperparams& h, const char* key, const char* op, Pair& out) {
  const std::vector<double> v = hyper_pair(h, key, op);
  out = Pair{v[0], v[1]};
}
void OptionsFields::from_hyper(const Hyperparams& h, const char* key, const char* op, Triple& out) {
  auto it = h.find(key);
  if (it == h.end()) throw KeyError(op, std::string("no hyperparameter '") + key + "'");
  const auto* v = std::get_if<std::vector<double>>(&it->second);
  if (!v || v->size() != 3)
    throw TypeError(op, std::string("hyperparameter '") + key + "' must be a list of three numbers");
  out = Triple{(*v)[0], (*v)[1], (*v)[2]};
}
void OptionsFields::from_hyper(const Hyperparams& h, const char* key, const char* op, std::int64_t& out) {
  const double n = hyper_number(h, key, op);
  if (!(std::fabs(n) < 9.007199254740992e15) || n != std::floor(n))
    throw ValueError(op, std::string("hyperparameter '") + key + "' must be a whole number, got " + detail::py_float(n));
  out = static_cast<std::int64_t>(n);
}
void OptionsFields::from_hyper(const Hyperparams& h, const char* key, const char* op, std::string& out) {
  out = hyper_string(h, key, op);
}

namespace checks {

using detail::py_float;

void apply(const std::string& op, double v, NonNegative rule) {
  if (!(v >= 0.0)) throw ValueError(op, std::string("Invalid ") + rule.what + ": " + py_float(v));
}

void apply(const std::string& op, double v, UnitInterval rule) {
  if (!(v >= 0.0 && v <= 1.0)) throw ValueError(op, std::string("Invalid ") + rule.what + ": " + py_float(v));
}

void apply(const std::string& op, const Pair& betas, Betas /*rule*/) {
  for (int i = 0; i < 2; ++i)
    if (!(betas[i] >= 0.0 && betas[i] < 1.0))
      throw ValueError(op, "Invalid beta parameter at index " + std::to_string(i) + ": " + py_float(betas[i]));
}

void apply(const std::string& op, const Pair& etas, Etas /*rule*/) {
  if (!(0.0 < etas[0] && etas[0] < 1.0 && 1.0 < etas[1]))
    throw ValueError(op, "Invalid eta values: " + py_float(etas[0]) + ", " + py_float(etas[1]));
}

void apply(const std::string& op, double v, AtLeastZero rule) {
  if (!(v >= 0.0)) throw ValueError(op, std::string(rule.what) + " should be >= 0 but is: " + py_float(v));
}

}  // namespace checks

}  // namespace dopt::optim
