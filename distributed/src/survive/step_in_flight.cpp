// settle_in_flight (step_in_flight.hpp).
#include "survive/step_in_flight.hpp"

#include <exception>

#include "dopt/runtime/error.hpp"

namespace dopt::optim::detail {

void settle_in_flight(Future<void>& in_flight, std::string& failed, const std::string& what, bool keep_error,
                      const std::string& op, int rank) {
  if (in_flight.valid()) {
    Future<void> f = std::move(in_flight);
    in_flight = Future<void>();
    f.wait();
    if (f.exception() && keep_error) {
      failed = what + " failed: ";
      try {
        f.get();
      } catch (const std::exception& e) {
        failed += e.what();
      } catch (...) {
        failed += "an unknown exception";
      }
    }
  }
  if (!failed.empty())
    throw StateError(op, failed + "; the ranks' parameters may differ from here on (build the optimizer anew and "
                                  "load a checkpoint)", rank);
}

}  // namespace dopt::optim::detail
