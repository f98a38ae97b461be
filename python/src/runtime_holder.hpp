#pragma once
// The one dopt::Runtime of a Python process, started on first use.
#include "dopt/actors/runtime.hpp"

namespace dopt::python {

/// Starts the runtime on first use (RuntimeOptions::from_env()).
Runtime& runtime();
/// Stops its actors and joins its threads; idempotent.
void shutdown_runtime();

}  // namespace dopt::python
