#!/usr/bin/env bash
# dopt's collectives against torch 1.13 gloo and OpenMPI, interleaved in one run.
#
#   bench/compare_collectives.sh BUILD_DIR [RUNS] [OUT.jsonl]
#
# For each run and world size (2, 4): gloo (../shared/baselines/gloo/bench_gloo.py;
# skipped with GLOO=0), OpenMPI over shared memory and over TCP
# (../shared/baselines/mpi/mpi_coll.c), dopt with real processes (dopt-run +
# dopt_bench_collectives) and dopt with simulated ranks in one process, and
# memcpy of the same sizes on one rank (the copy rate the floors are taken
# at, measured in the same run). Ops all_reduce, broadcast, all_gather and
# barrier (dopt); sizes 4 KiB, 1 MiB, 16 MiB, 64 MiB, 256 MiB (nccl-tests
# convention, as the baselines). Every launch goes through
# ../shared/baselines/launch.py, which records the foreign CPU load; lines are
# tagged "impl". Then
#   python3 bench/summarize_collectives.py OUT.jsonl
# prints the table of docs/performance.md.
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [RUNS] [OUT.jsonl]}
runs=${2:-3}
here="$(cd "$(dirname "$0")" && pwd)"
shared="${DOPT_SHARED_DIR:-$here/../../shared}"
out=${3:-$here/results/collectives_compare.jsonl}
py=/usr/bin/python3
launch=("$py" "$shared/baselines/launch.py" --out "$out" --max-wait 10 --tries 1)
sizes=4096,1048576,16777216,67108864,268435456
ops=(all_reduce broadcast all_gather)
mkdir -p "$here/results" /tmp/dopt-mpi
mpicc -O2 "$shared/baselines/mpi/mpi_coll.c" -o /tmp/dopt-mpi/mpi_coll
mpirun_=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
bytes=()
IFS=, read -ra bytes <<< "$sizes"
for r in $(seq 1 "$runs"); do
  for ws in 2 4; do
    echo "compare_collectives: run $r/$runs, world size $ws" >&2
    if [[ "${GLOO:-1}" != 0 ]]; then
      "${launch[@]}" --tag impl=gloo -- "$py" "$shared/baselines/gloo/bench_gloo.py" --world-size "$ws" \
        --sizes "$sizes" --ops all_reduce,broadcast,all_gather --run "$r" >/dev/null
    fi
    "${launch[@]}" --tag impl=mpi_shm -- "${mpirun_[@]}" -np "$ws" /tmp/dopt-mpi/mpi_coll "$r" shm >/dev/null
    "${launch[@]}" --tag impl=mpi_tcp -- "${mpirun_[@]}" -np "$ws" --mca btl self,tcp --mca btl_tcp_if_include lo \
      /tmp/dopt-mpi/mpi_coll "$r" tcp >/dev/null
    for op in "${ops[@]}"; do
      "${launch[@]}" --tag impl=dopt --tag run="$r" -- "$build/tools/dopt-run" --nproc-per-node "$ws" --master-port 0 \
        --no-prefix "$build/bench/dopt_bench_collectives" --op "$op" --bytes "${bytes[@]}" >/dev/null
      "${launch[@]}" --tag impl=dopt_sim --tag run="$r" -- "$build/bench/dopt_bench_collectives" --ranks "$ws" \
        --op "$op" --bytes "${bytes[@]}" >/dev/null
    done
    "${launch[@]}" --tag impl=dopt --tag run="$r" -- "$build/tools/dopt-run" --nproc-per-node "$ws" --master-port 0 \
      --no-prefix "$build/bench/dopt_bench_collectives" --op barrier --bytes 4 --iters 2000 >/dev/null
    "${launch[@]}" --tag impl=dopt_sim --tag run="$r" -- "$build/bench/dopt_bench_collectives" --ranks "$ws" \
      --op barrier --bytes 4 --iters 2000 >/dev/null
  done
  "${launch[@]}" --tag impl=memcpy --tag run="$r" -- "$build/bench/dopt_bench_collectives" --ranks 1 \
    --op memcpy --bytes "${bytes[@]}" >/dev/null
done
echo "compare_collectives: wrote $out" >&2
