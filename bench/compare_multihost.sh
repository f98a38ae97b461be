#!/usr/bin/env bash
# Collectives across two "hosts" (network namespaces on one machine, joined by
# veth pairs on a bridge, as tests/multihost.sh makes them), in one run:
# dopt (its planes: hierarchical), dopt over MPI (DOPT_BACKEND=mpi), torch 1.13
# gloo, OpenMPI over TCP (../shared/baselines/mpi/mpi_coll.c), and the raw TCP
# limit (dopt_bench_raw_tcp: both hosts sending to each other at once).
# Needs root.
#
#   bench/compare_multihost.sh BUILD_DIR [OUT.jsonl] [SIZES] [PER_HOST...]
#
# SIZES: comma-separated bytes (default 4 KiB, 1, 16, 64, 256 MiB; nccl-tests
# convention: all_reduce's tensor, all_gather's output). PER_HOST: ranks per
# host (default 1 2). IMPLS (environment) narrows the run to some of
# "raw_tcp dopt dopt_mpi mpi_tcp gloo" (the default: all); RATE (environment,
# e.g. 1gbit) limits each host's link with tc tbf (each way), so that the
# network and not the machine's CPUs bounds what crosses, as between real
# hosts (recorded as "rate"); DOPT_TCP_STREAMS
# and the other settings of the environment reach dopt's ranks (and are
# recorded as "streams" on dopt's lines). Every line of OUT is tagged "impl", "hosts", "per_host";
#   python3 bench/multihost/summarize.py OUT.jsonl
# prints the table of docs/performance.md.
set -u
build=$(cd "${1:?usage: $0 BUILD_DIR [OUT.jsonl] [SIZES] [PER_HOST...]}" && pwd)
here="$(cd "$(dirname "$0")" && pwd)"
out=${2:-$here/results/multihost_compare.jsonl}
sizes=${3:-4096,1048576,16777216,67108864,268435456}
shift 3 2>/dev/null || shift $#
pers=("$@")
impls=" ${IMPLS:-raw_tcp dopt dopt_mpi mpi_tcp gloo} "
want() { [[ "$impls" == *" $1 "* ]]; }
[ ${#pers[@]} -gt 0 ] || pers=(1 2)
shared="${DOPT_SHARED_DIR:-$here/../../shared}"
py=/usr/bin/python3
mkdir -p "$(dirname "$out")"
[ "$(id -u)" = 0 ] || { echo "compare_multihost: needs root (network namespaces)" >&2; exit 1; }

tag=dmb$$
work=$(mktemp -d /tmp/dopt-mhbench.XXXXXX)
nss=()
cleanup() {
  for n in "${nss[@]}"; do ip netns pids "$n" 2>/dev/null | while read -r q; do kill -KILL "$q" 2>/dev/null; done; done
  for n in "${nss[@]}"; do ip netns del "$n" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "${tag}sw" && nss+=("${tag}sw")
ip -n "${tag}sw" link add br0 type bridge
ip -n "${tag}sw" link set br0 up
ip -n "${tag}sw" addr add 10.231.0.254/24 dev br0
for i in 0 1; do
  ip netns add "${tag}h$i" && nss+=("${tag}h$i")
  ip -n "${tag}sw" link add "p$i" type veth peer name eth0 netns "${tag}h$i"
  ip -n "${tag}sw" link set "p$i" master br0 up
  ip -n "${tag}h$i" link set lo up
  ip -n "${tag}h$i" addr add "10.231.0.$((i + 1))/24" dev eth0
  ip -n "${tag}h$i" link set eth0 up
  if [ -n "${RATE:-}" ]; then
    # burst: at least one timer tick's worth at the rate (tbf drops the rest)
    tc -n "${tag}h$i" qdisc add dev eth0 root tbf rate "$RATE" burst 1mb latency 200ms ||
      { echo "compare_multihost: cannot limit the link with tc tbf" >&2; exit 1; }
  fi
done
in_host() {
  local i=$1
  shift
  ip netns exec "${tag}h$i" unshare --uts --ipc --mount --propagation private \
    bash -c "hostname host$i; mount -t tmpfs -o size=2g tmpfs /dev/shm; "'exec "$@"' _ "$@"
}
agent=$work/agent.sh
cat >"$agent" <<EOF
#!/usr/bin/env bash
h=\$1; shift
i=\${h#host}
exec ip netns exec ${tag}h\$i unshare --uts --ipc --mount --propagation private \
  bash -c "hostname host\$i; mount -t tmpfs -o size=2g tmpfs /dev/shm; \$*"
EOF
chmod +x "$agent"
mkdir -p /tmp/dopt-mpi
mpicc -O2 "$shared/baselines/mpi/mpi_coll.c" -o /tmp/dopt-mpi/mpi_coll
secret=$work/secret
mkdir -m 700 "$secret" && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret/s" && chmod 600 "$secret/s"
export DOPT_JOB_ID=mhbench-$$ DOPT_SECRET_FILE=$secret/s
load() { cut -d' ' -f1-3 /proc/loadavg; }
# record IMPL PER: tags every JSON line of stdin
record() {
  "$py" -c '
import json, sys
impl, per, load = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    r.update(impl=impl, hosts=2, per_host=per, loadavg_before=load)
    if __import__("os").environ.get("RATE"):
        r.update(rate=__import__("os").environ["RATE"])
    if impl.startswith("dopt") and "DOPT_TCP_STREAMS" in __import__("os").environ:
        r.update(streams=int(__import__("os").environ["DOPT_TCP_STREAMS"]))
    print(json.dumps(r))' "$1" "$2" "$(load)" | tee -a "$out"
}
port=29600
mpirun_() {
  local per=$1
  shift
  ip netns exec "${tag}sw" timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none -np $((2 * per)) \
    --host "host0:$per,host1:$per" --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include 10.231.0.0/24 \
    --mca btl_tcp_if_include 10.231.0.0/24 --mca btl self,vader,tcp "$@"
}
IFS=, read -ra bytes <<<"$sizes"
for per in "${pers[@]}"; do
  echo "compare_multihost: 2 hosts x $per ranks, load $(load)" >&2
  # raw TCP: both directions at once, one stream per rank of a host
  if want raw_tcp; then
    in_host 0 "$build/bench/dopt_bench_raw_tcp" server 29599 "$per" "$sizes" | record raw_tcp "$per" &
    sleep 0.3
    in_host 1 "$build/bench/dopt_bench_raw_tcp" client 10.231.0.1 29599 "$per" "$sizes" >/dev/null
    wait
  fi
  for op in all_reduce all_gather; do
    port=$((port + 1))
    want dopt || continue
    for i in 0 1; do
      in_host "$i" "$build/tools/dopt-run" --nproc-per-node "$per" --nnodes 2 --node-rank "$i" --master-addr 10.231.0.1 \
        --master-port $port --no-prefix "$build/bench/dopt_bench_collectives" --op $op --bytes "${bytes[@]}" \
        >"$work/dopt$i" 2>"$work/dopt$i.err" &
    done
    wait
    record dopt "$per" <"$work/dopt0"
    port=$((port + 1))
    want dopt_mpi || continue
    mpirun_ "$per" -x DOPT_BACKEND=mpi -x MASTER_ADDR=10.231.0.1 -x MASTER_PORT=$port -x DOPT_JOB_ID \
      -x DOPT_SECRET_FILE "$build/bench/dopt_bench_collectives" --op $op --bytes "${bytes[@]}" 2>"$work/dmpi.err" |
      record dopt_mpi "$per"
  done
  want mpi_tcp && mpirun_ "$per" /tmp/dopt-mpi/mpi_coll 1 tcp 2>"$work/mpi.err" | record mpi_tcp "$per"
  port=$((port + 1))
  want gloo || continue
  for ((r = 0; r < 2 * per; r++)); do
    in_host $((r / per)) env RANK=$r WORLD_SIZE=$((2 * per)) MASTER_ADDR=10.231.0.1 MASTER_PORT=$port \
      GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 "$py" "$here/multihost/gloo_rank.py" "$sizes" \
      >"$work/gloo$r" 2>"$work/gloo$r.err" &
  done
  wait
  record gloo "$per" <"$work/gloo0"
done
echo "compare_multihost: wrote $out" >&2
