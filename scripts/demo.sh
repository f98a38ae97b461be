#!/usr/bin/env bash
# The README's main-job command: installs what is missing, builds dopt-train
# and runs it. With no arguments: 4 simulated ranks in this process, ZeRO(Adam),
# 2000 steps (about 20-40 s on 2 cores), progress bar, loss curve in
# build-demo/loss.svg. Any arguments go to dopt-train (see docs/dopt-train.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build="${DOPT_DEMO_BUILD_DIR:-build-demo}"
echo "demo: building dopt-train in $build (first time: about 2 minutes on 2 cores)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDOPT_ENABLE_TESTS=OFF -DDOPT_ENABLE_BENCH=OFF >/dev/null
cmake --build "$build" -j"${DOPT_JOBS:-2}" --target dopt-train dopt-run >/dev/null
if [[ $# -eq 0 ]]; then
  set -- --optim zero --inner adam --ranks 4 --svg "$build/loss.svg" --metrics "$build/metrics.jsonl"
fi
exec "$build/tools/dopt-train" "$@"
