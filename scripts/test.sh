#!/usr/bin/env bash
# The README's test command: installs what is missing, configures, builds and
# runs every test (CTest). Build folder: $DOPT_BUILD_DIR (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build="${DOPT_BUILD_DIR:-build}"
jobs="${DOPT_JOBS:-2}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDOPT_ENABLE_TESTS=ON ${DOPT_CMAKE_ARGS:-}
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs" ${DOPT_CTEST_ARGS:-}
