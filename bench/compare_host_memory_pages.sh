#!/usr/bin/env bash
# ZeroBuddyUpdate::host_memory's step() overhead and recovery with the
# machine's /dev/shm as it is, against /dev/shm mounted huge=advise (a tmpfs
# of its own in a mount namespace: the machine's /dev/shm is not touched),
# simulated ranks and processes, rounds alternated in one run. Root only.
#   bench/compare_host_memory_pages.sh [ROUNDS] [OUT.jsonl] [-- BENCH ARGS...]
# Default: 3 rounds, 50M parameters, 4 ranks, --steps $STEPS (default 7); one JSON line per run
# (dopt_bench_survive's, with "pages": "as-is" or "huge=advise", and "at").
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
out=${2:-bench/results/survive_host_memory_pages_$(date -u +%Y-%m-%d).jsonl}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
args=(--steps "${STEPS:-7}" --recover host_memory "$@")
bench=build/bench/dopt_bench_survive
run=build/tools/dopt-run
[ "$(id -u)" = 0 ] || { echo "needs root (a mount namespace with a /dev/shm of its own)" >&2; exit 2; }
one() {  # PAGES MODE
  local pages=$1 mode=$2 cmd
  if [ "$mode" = sim ]; then
    cmd="$bench ${args[*]}"
  else
    cmd="$run --on-failure continue --master-port 0 --nproc-per-node 4 $bench ${args[*]}"
  fi
  if [ "$pages" = huge=advise ]; then
    cmd="mount -t tmpfs -o huge=advise,size=50% tmpfs /dev/shm && $cmd"
    unshare -m --propagation private bash -c "$cmd" 2>/dev/null
  else
    bash -c "$cmd" 2>/dev/null
  fi | sed -n 's/^\[rank 0\] //; /^{/p' | tail -1 |
    python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["pages"]=sys.argv[1]; d["at"]=sys.argv[2]; d["loadavg_before"]=float(sys.argv[3]); print(json.dumps(d))' \
      "$pages" "$(date -u +%H:%M:%S)" "$(cut -d' ' -f1 /proc/loadavg)" >>"$out"
  tail -1 "$out" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["at"], d["ranks_are"], d["pages"], "dev_shm_huge="+d["dev_shm_huge"], "overhead %+.1f%%" % (100*d["step_overhead_host_memory"]), "kill->next %.0f ms" % d["kill_to_next_step_ms"])'
}
for ((i = 0; i < rounds; i++)); do
  for mode in sim proc; do
    if ((i % 2)); then order="huge=advise as-is"; else order="as-is huge=advise"; fi
    for pages in $order; do one "$pages" "$mode"; done
  done
done
echo "wrote $out"
