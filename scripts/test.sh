#!/usr/bin/env bash
# The README's test command: installs what is missing, configures, builds and
# runs every test (CTest). Build folder: $DOPT_BUILD_DIR (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build="${DOPT_BUILD_DIR:-build}"
jobs="${DOPT_JOBS:-2}"
# Compile through ccache when it is there (install-deps.sh installs it): the
# pip test builds the C++ core a second time in build-pip/, which then costs
# seconds instead of a full build. CI's .ci/run sets its own cache folder.
if command -v ccache >/dev/null && [[ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]]; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDOPT_ENABLE_TESTS=ON ${DOPT_CMAKE_ARGS:-}
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs" ${DOPT_CTEST_ARGS:-}
