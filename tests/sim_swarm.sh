#!/usr/bin/env bash
# One seed of the CTest swarm (label sim): runs the library's multi-rank
# tests (Catch filter $3) under the deterministic scheduler with seed $2,
# twice, and compares the two runs' traces (one line per simulate() call):
# a failing test or a difference fails, naming the seed to replay with.
#   usage: sim_swarm.sh <dopt_unit_tests> <seed> <catch filter>
set -uo pipefail
bin="$1" seed="$2" filter="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
for run in 1 2; do
  if ! DOPT_SIM_SEED="$seed" DOPT_SIM_TRACE_LOG="$dir/trace$run" "$bin" "$filter" > "$dir/out$run" 2>&1; then
    tail -n 60 "$dir/out$run"
    echo "sim swarm: seed $seed failed (run $run); replay with: DOPT_SIM_SEED=$seed $bin '$filter'"
    exit 1
  fi
done
if ! diff -q "$dir/trace1" "$dir/trace2" > /dev/null; then
  diff "$dir/trace1" "$dir/trace2" | head -n 20
  echo "sim swarm: seed $seed is not deterministic: the two runs' traces differ (above)"
  exit 1
fi
echo "sim swarm: seed $seed: $(wc -l < "$dir/trace1") simulations, both runs passed with equal traces"
