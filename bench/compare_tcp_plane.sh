#!/usr/bin/env bash
# The TCP plane on loopback against torch 1.13 gloo, in one run.
#
#   bench/compare_tcp_plane.sh BUILD_DIR OUT.jsonl [STREAMS...]
#
# For world sizes 2 and 4, all_reduce and all_gather at 1, 16, 64, 256 MiB:
# gloo (../shared/baselines/gloo/bench_gloo.py, GLOO_SOCKET_IFNAME=lo), then
# dopt with real processes on the TCP plane (dopt-run, DOPT_TRANSPORT=tcp,
# dopt_bench_collectives) once per value of DOPT_TCP_STREAMS given (default:
# "0 2 4"; 0 = every message on the one control connection, as before
# striping). Sizes follow nccl-tests (all_gather: SIZE is the output). Each
# line of OUT.jsonl is tagged with impl, streams and the load average before
# the launch. SIZES / OPS / WORLDS / ITERS in the environment narrow the run
# (the machine is shared: keep it short). BEFORE=/path/to/an/older/
# dopt_bench_collectives also times that binary (impl dopt_tcp_before, its
# own defaults) in the same run, for before/after figures.
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR OUT.jsonl [STREAMS...]}
out=${2:?usage: $0 BUILD_DIR OUT.jsonl [STREAMS...]}
shift 2
streams=("$@")
[[ ${#streams[@]} -gt 0 ]] || streams=(0 2 4)
here="$(cd "$(dirname "$0")" && pwd)"
shared="${DOPT_SHARED_DIR:-$here/../../shared}"
sizes=${SIZES:-1048576,16777216,67108864,268435456}
ops=${OPS:-all_reduce,all_gather}
worlds=${WORLDS:-2 4}
coll=$build/bench/dopt_bench_collectives
iters=${ITERS:-5}
py=/usr/bin/python3
load() { cut -d' ' -f1 /proc/loadavg; }
tag() { # prefix every JSON line with the run's tags
  sed -u "s/^{/{\"impl\": \"$1\", \"streams\": $2, \"loadavg_before\": $3, /" >> "$out"
}
IFS=, read -ra bytes <<< "$sizes"
IFS=, read -ra oplist <<< "$ops"
for ws in $worlds; do
  if [[ "${GLOO:-1}" != 0 ]]; then
    echo "compare_tcp_plane: gloo, world $ws" >&2
    l=$(load)
    GLOO_SOCKET_IFNAME=lo "$py" "$shared/baselines/gloo/bench_gloo.py" --world-size "$ws" --sizes "$sizes" \
      --ops "$ops" 2>/dev/null | grep '^{' | tag gloo -1 "$l"
  fi
  if [[ -n "${BEFORE:-}" ]]; then
    for op in "${oplist[@]}"; do
      echo "compare_tcp_plane: dopt tcp before, world $ws, $op" >&2
      l=$(load)
      DOPT_TRANSPORT=tcp "$build/tools/dopt-run" --nproc-per-node "$ws" --master-port 0 \
        --no-prefix "$BEFORE" --op "$op" --bytes "${bytes[@]}" --iters "$iters" | grep '^{' | tag dopt_tcp_before -1 "$l"
    done
  fi
  for s in "${streams[@]}"; do
    for op in "${oplist[@]}"; do
      echo "compare_tcp_plane: dopt tcp, world $ws, streams $s, $op" >&2
      l=$(load)
      DOPT_TRANSPORT=tcp DOPT_TCP_STREAMS=$s "$build/tools/dopt-run" --nproc-per-node "$ws" --master-port 0 \
        --no-prefix "$coll" --op "$op" --bytes "${bytes[@]}" --iters "$iters" | grep '^{' | tag dopt_tcp "$s" "$l"
    done
  done
done
echo "compare_tcp_plane: wrote $out" >&2
