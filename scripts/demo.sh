#!/usr/bin/env bash
# The README's main-job command: installs what is missing, builds the demo and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build="${DOPT_DEMO_BUILD_DIR:-build-demo}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDOPT_ENABLE_TESTS=OFF -DDOPT_ENABLE_BENCH=OFF >/dev/null
cmake --build "$build" -j"${DOPT_JOBS:-2}" --target dopt-example-local-training
exec "$build/examples/local_training/dopt-example-local-training" "$@"
