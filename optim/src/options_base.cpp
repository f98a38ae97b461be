#include "dopt/optim/options_base.hpp"

namespace dopt::optim::detail {

void check_known_keys(const Hyperparams& h, std::initializer_list<const char*> known, const std::string& op) {
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

}  // namespace dopt::optim::detail
