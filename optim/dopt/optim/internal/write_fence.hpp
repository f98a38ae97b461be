#pragma once
// Internal: copies of parameters and optimizer state that run in the
// background (the Checkpointer's background snapshots), and the writers that
// must not change those tensors before the copies are made.
//
// The Checkpointer calls fence_add(copied) on the rank's thread as a
// save_async with CheckpointerOptions::background_snapshot starts; `copied`
// becomes ready (value or error) once the writer thread has copied every
// tensor. Every writer of parameters or optimizer state in dopt calls
// fence_wait() first: Optimizer::step(), FunctionalOptimizer::step(),
// ZeroRedundancyOptimizer::step()/step_async(), ModelAverager's and
// DiLoCoAverager's averages. It returns at once when no copy is in flight in
// this process (one atomic load); otherwise it waits for every copy added
// before it was called, by any rank of the process (simulated ranks share
// the fence: a rank may wait for another's copy, which never waits for it),
// through Future::wait (deterministic simulation: a scheduling point). The
// copies' errors are not thrown here: the Checkpointer reports them.
// Any thread; no lock is held while waiting.
#include "dopt/actors/future.hpp"

namespace dopt::detail {

void fence_add(Future<void> copied);
void fence_wait();

}  // namespace dopt::detail
