#include "dopt/optim/options_base.hpp"

#include "optim_extra.hpp"

namespace dopt::optim::detail {

void check_known_keys(const Hyperparams& h, const std::vector<const char*>& known, const std::string& op) {
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

void no_fields(const char* type) {
  throw StateError("OptionsCRTP", std::string("options type ") + type +
                                      " has no fields() and does not override to_hyperparams / set_hyperparams");
}

void from_hyper(const Hyperparams& h, const char* key, const char* op, double& out) { out = hyper_number(h, key, op); }
void from_hyper(const Hyperparams& h, const char* key, const char* op, bool& out) { out = hyper_flag(h, key, op); }
void from_hyper(const Hyperparams& h, const char* key, const char* op, Pair& out) {
  out = to_pair(hyper_pair(h, key, op));
}

void require_nonnegative(const std::string& op, const char* what, double v) {
  if (!(v >= 0.0)) throw ValueError(op, std::string("Invalid ") + what + ": " + py_float(v));
}

void require_betas(const std::string& op, const Pair& betas) {
  for (int i = 0; i < 2; ++i)
    if (!(betas[i] >= 0.0 && betas[i] < 1.0))
      throw ValueError(op, "Invalid beta parameter at index " + std::to_string(i) + ": " + py_float(betas[i]));
}

}  // namespace dopt::optim::detail
