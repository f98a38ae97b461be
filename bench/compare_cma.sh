#!/usr/bin/env bash
# Large all_gather and broadcast between processes: dopt reading peers'
# tensors with process_vm_readv (DOPT_SHM_CMA=1), dopt copying through the
# shared staging buffers (the default), and OpenMPI over shared memory
# (which reads peers' memory with CMA too), interleaved in one run.
#
#   bench/compare_cma.sh BUILD_DIR [RUNS] [OUT.jsonl]
#   python3 bench/summarize_cma.py OUT.jsonl
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [RUNS] [OUT.jsonl]}
runs=${2:-3}
here="$(cd "$(dirname "$0")" && pwd)"
shared="${DOPT_SHARED_DIR:-$here/../../shared}"
out=${3:-$here/results/cma_compare.jsonl}
py=/usr/bin/python3
launch=("$py" "$shared/baselines/launch.py" --out "$out" --max-wait 10 --tries 1)
bytes=(1048576 16777216 67108864 268435456)
mkdir -p "$here/results" /tmp/dopt-mpi
mpicc -O2 "$shared/baselines/mpi/mpi_coll.c" -o /tmp/dopt-mpi/mpi_coll
for r in $(seq 1 "$runs"); do
  for ws in 2 4; do
    echo "compare_cma: run $r/$runs, world size $ws" >&2
    "${launch[@]}" --tag impl=mpi_shm -- mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ws" \
      /tmp/dopt-mpi/mpi_coll "$r" shm >/dev/null
    for op in all_gather broadcast; do
      "${launch[@]}" --tag impl=dopt_cma --tag run="$r" -- env DOPT_SHM_CMA=1 "$build/tools/dopt-run" \
        --nproc-per-node "$ws" --master-port 0 --no-prefix "$build/bench/dopt_bench_collectives" --op "$op" --bytes "${bytes[@]}" >/dev/null
      "${launch[@]}" --tag impl=dopt_staged --tag run="$r" -- "$build/tools/dopt-run" \
        --nproc-per-node "$ws" --master-port 0 --no-prefix "$build/bench/dopt_bench_collectives" --op "$op" \
        --bytes "${bytes[@]}" >/dev/null
    done
  done
done
echo "compare_cma: wrote $out" >&2
