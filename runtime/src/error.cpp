#include "dopt/runtime/error.hpp"

namespace dopt {
namespace {
std::string compose(const std::string& op, const std::string& what, std::optional<int> rank) {
  std::string msg = op;
  if (rank) msg += " [rank " + std::to_string(*rank) + "]";
  if (!msg.empty()) msg += ": ";
  msg += what;
  return msg;
}
}  // namespace

Error::Error(std::string op, std::string what, std::optional<int> rank)
    : std::runtime_error(compose(op, what, rank)),
      op_(std::move(op)),
      detail_(std::move(what)),
      rank_(rank) {}

}  // namespace dopt
