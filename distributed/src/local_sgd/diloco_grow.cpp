// DiLoCoAverager::take_grown_group (diloco.hpp, "growing back"): the averager
// goes on over a grown group once an average in flight over the old group has
// landed (post_local_sgd_catch_up, post_local_sgd_grow.cpp, sends the state
// to the newcomers). Rank thread.
#include <utility>

#include "dopt/distributed/diloco.hpp"

namespace dopt::optim {

void DiLoCoAverager::take_grown_group(ProcessGroup grown, const char* op) {
  if (!grown.valid() || !grown.is_member())
    throw ValueError(op, "the grown group is invalid or does not hold this rank", process_group().rank());
  settle();
  // land() divides by the group's size: the average in flight must land
  // while the averager still holds the group that prepared it.
  if (pending_) finish_pending();
  set_process_group(std::move(grown));
}

}  // namespace dopt::optim
