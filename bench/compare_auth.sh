#!/usr/bin/env bash
# Authentication's cost (docs/performance.md, "Authentication"):
#   bench/compare_auth.sh BUILD [BASELINE_BUILD] [REPEATS]
# 1. dopt's handshake over loopback with and without a secret
#    (dopt_bench_auth handshake);
# 2. a 2-rank job's start-up (init_process_group: rendezvous, handshakes, data
#    plane) with a secret and without (then the ranks' ports take the session
#    key), on shared memory and on the TCP plane (dopt_bench_auth job);
# 3. a 4 KiB all_reduce per call, the same program (dopt_bench_collectives)
#    from BUILD and from BASELINE_BUILD (a build before authentication was on
#    for jobs without a secret), each REPEATS times (default 5), alternating.
# Prints JSON lines; nothing else runs on the machine meanwhile, ideally.
set -euo pipefail
build=${1:?BUILD}
base=${2:-}
reps=${3:-5}
run() { env -u RANK -u WORLD_SIZE "$@" 2>/dev/null | grep '^{'; }
"$build/bench/dopt_bench_auth" handshake --iters 2000
for r in $(seq "$reps"); do
  for tr in auto tcp; do
    for sec in --no-secret ""; do
      run DOPT_TRANSPORT=$tr "$build/tools/dopt-run" $sec --no-prefix --nproc-per-node 2 --master-port 0 \
        "$build/bench/dopt_bench_auth" job --iters 5000
    done
    for b in "$build" ${base:+"$base"}; do
      line=$(run DOPT_TRANSPORT=$tr "$b/tools/dopt-run" --no-secret --no-prefix --nproc-per-node 2 --master-port 0 \
        "$b/bench/dopt_bench_collectives" --op all_reduce --bytes 4096 --iters 5000 | head -1)
      echo "{\"build\": \"$b\", \"transport\": \"$tr\", \"secret\": false, \"collectives\": $line}"
    done
  done
done
