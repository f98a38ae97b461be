#!/usr/bin/env bash
# Multi-host tests on one machine: every "host" is a network namespace of its
# own (joined to the others by veth pairs on a bridge in a switch namespace),
# with its own host name (UTS namespace), IPC namespace and /dev/shm, so dopt
# sees it as another machine. Needs root (CI is root); reports itself skipped
# (exit 77) with the reason where namespaces cannot be made. Every namespace,
# link and process it makes is removed on exit, also when a check fails.
#
#   tests/multihost.sh SCENARIO BUILD_DIR
#
# Scenarios (2 hosts x 2 ranks unless said otherwise; dopt-run on each host):
#   battery    every collective, dtype and op checked against exact values;
#              the hierarchical plane taken, bytes crossed between hosts
#   digest     every collective on random floats: each rank's digest equal to
#              the same ranks on one host (4 processes, shared memory)
#   digest1    the same with 2 hosts x 1 rank (the hierarchical plane's TCP
#              ring path, messages of 256 KiB and more striped), against 2
#              processes on one host
#   zero       ZeroRedundancyOptimizer parity;  plsgd: post-local SGD parity
#   slow       the battery with each host's link limited to 100 Mbit/s (tbf;
#              plus 2 ms delay and 0.1 % loss where the kernel has netem)
#   cut        the link of host 1 taken down during all_reduces: every rank
#              fails within the bound naming a rank of the other host, each
#              dopt-run exits non-zero
#   ipv6       the battery over IPv6 addresses only
#   portrange  DOPT_PORT_RANGE: every listener of every rank in the range
#              (sampled while the ranks run 4 s of small all_reduces)
#   samename   two namespaces with the machine's host name, each its own
#              /dev/shm: hierarchical plane; and with DOPT_TRANSPORT=tcp and
#              DOPT_BIND_ADDR=0.0.0.0: the flat TCP plane, 4 s of small
#              all_reduces, no hang
#   sharedshm  two namespaces sharing /dev/shm (not the network): the
#              shared-memory plane, control connections over the link
#   ipc        two processes on this host's network in separate IPC
#              namespaces with their own /dev/shm: hierarchical plane
#   unreachable host 1's ranks advertise an address nobody has: every rank
#              fails naming it, within the handshake bound
#   torchrun   torchrun's agent with the c10d rendezvous (the backend of
#              --nnodes MIN:MAX) on each host, each host's /etc/hosts as
#              Debian writes it (its own name 127.0.1.1, the other host by
#              its address): MASTER_ADDR is host 0's name, loopback there;
#              the battery on 2 x 2 ranks, hierarchical plane
#   mpirun     OpenMPI's mpirun across the namespaces (its daemons started
#              through an rsh agent that enters them): the battery on the
#              hierarchical plane, then DOPT_BACKEND=mpi: every collective bit
#              for bit as on one host, bytes crossed through MPI
set -u
scenario=${1:?scenario}
build=${2:?build dir}
build=$(cd "$build" && pwd)
run=$build/tools/dopt-run
peers=$build/tests
[ -x "$run" ] || { echo "no $run"; exit 1; }

skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "network namespaces need root (this test runs as uid $(id -u))"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"

tag=dmh$$
work=$(mktemp -d /tmp/dopt-multihost.XXXXXX)
nss=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for n in "${nss[@]}"; do ip netns pids "$n" 2>/dev/null | while read -r q; do kill -KILL "$q" 2>/dev/null; done; done
  for n in "${nss[@]}"; do ip netns del "$n" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "${tag}sw" 2>"$work/err" || skip "cannot create network namespaces: $(cat "$work/err")"
nss+=("${tag}sw")
ip -n "${tag}sw" link add br0 type bridge 2>"$work/err" || skip "cannot create a bridge: $(cat "$work/err")"
ip -n "${tag}sw" link set br0 up
ip -n "${tag}sw" link set lo up
ip -n "${tag}sw" addr add 10.231.0.254/24 dev br0

# host I: namespace ${tag}hI, eth0 = 10.231.0.(I+1) and fd00:231::(I+1)
add_host() {
  local i=$1 ns=${tag}h$1
  ip netns add "$ns" || exit 1
  nss+=("$ns")
  ip -n "${tag}sw" link add "p$i" type veth peer name eth0 netns "$ns" || exit 1
  ip -n "${tag}sw" link set "p$i" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "10.231.0.$((i + 1))/24" dev eth0
  ip -n "$ns" addr add "fd00:231::$((i + 1))/64" dev eth0 nodad
  ip -n "$ns" link set eth0 up
}
hosts=2
per=2  # ranks per host
[ "$scenario" = digest1 ] && per=1
for ((i = 0; i < hosts; i++)); do add_host "$i"; done
unshare --uts --ipc --mount --propagation private true 2>"$work/err" ||
  skip "cannot create UTS/IPC/mount namespaces: $(cat "$work/err")"

secret_dir=$work/secret
mkdir -m 700 "$secret_dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret_dir/s"
chmod 600 "$secret_dir/s"
export DOPT_JOB_ID=multihost-$$ DOPT_SECRET_FILE=$secret_dir/s DOPT_DEBUG=1
export DOPT_TIMEOUT_MS=${DOPT_TIMEOUT_MS:-60000}

# in_host I [--same-name] [--shared-shm] [--hosts FILE] CMD...: CMD in host I's
# namespaces (FILE: its /etc/hosts).
in_host() {
  local i=$1 name=1 shm=1 hosts_file=""
  shift
  while :; do
    case $1 in
      --same-name) name=0; shift ;;
      --shared-shm) shm=0; shift ;;
      --hosts) hosts_file=$2; shift 2 ;;
      *) break ;;
    esac
  done
  local setup=""
  [ -n "${hosts_file:-}" ] && setup+="mount --bind $hosts_file /etc/hosts; "
  [ $name = 1 ] && setup+="hostname host$i; "
  [ $shm = 1 ] && setup+="mount -t tmpfs -o size=1g tmpfs /dev/shm; "
  ip netns exec "${tag}h$i" unshare --uts --ipc --mount --propagation private \
    bash -c "$setup"'exec "$@"' _ "$@"
}

# start_hosts ARGS_FOR_IN_HOST -- PEER ARGS: dopt-run on each host, $per ranks each;
# logs in $work/hI.out / .err; pids in hpid[I].
master=10.231.0.1
port=29511
declare -a hpid
start_hosts() {
  local opts=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  for ((i = 0; i < hosts; i++)); do
    in_host "$i" "${opts[@]}" "$run" --nproc-per-node "$per" --nnodes "$hosts" --node-rank "$i" \
      --master-addr "$master" --master-port "$port" "$@" >"$work/h$i.out" 2>"$work/h$i.err" &
    hpid[$i]=$!
    pids+=($!)
  done
}
# wait_hosts: 0 when every dopt-run exited 0.
wait_hosts() {
  local rc=0
  for ((i = 0; i < hosts; i++)); do
    wait "${hpid[$i]}" || { echo "host $i: dopt-run exited $?"; rc=1; }
  done
  return $rc
}
show() { for ((i = 0; i < hosts; i++)); do echo "--- host $i stdout:"; tail -n 8 "$work/h$i.out"; echo "--- host $i stderr:"; tail -n 8 "$work/h$i.err"; done; }
fail() { echo "FAIL: $*"; show; exit 1; }
# same_digests WHAT FILE: every rank's digest across the hosts equals the one in
# FILE (the run on one host); WHAT goes in the failure's text
same_digests() {
  for ((r = 0; r < per * hosts; r++)); do
    a=$(cat "$work"/h*.out | sed -n "s/^\[rank $r\] digest $r \([0-9a-f]*\)$/\1/p")
    b=$(sed -n "s/^\[rank $r\] digest $r \([0-9a-f]*\)$/\1/p" "$2")
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "rank $r$1: digest across hosts '$a' != on one host '$b'"
    echo "rank $r$1: digest $a on 2 hosts and on one host"
  done
}
# every rank printed "ok R" and ran on plane $1; bytes to other hosts > 0 when $2 = crossed
expect_ok() {
  local plane=$1
  for ((r = 0; r < per * hosts; r++)); do
    cat "$work"/h*.out | grep -q "^\[rank $r\] ok $r " || fail "rank $r did not finish"
    cat "$work"/h*.err | grep -q "^\[rank $r\] dopt: note: \[rank $r\]: the world group runs on the $plane plane" ||
      fail "rank $r did not run on the $plane plane"
  done
  if [ "${2:-}" = crossed ]; then
    local b
    b=$(cat "$work"/h*.out | sed -n 's/^\[rank [0-9]*\] plane [a-z]* \([0-9]*\)$/\1/p' | sort -n | head -n 1)
    [ -n "$b" ] && [ "$b" -gt 0 ] || fail "no bytes crossed between hosts (smallest count: '${b:-none}')"
    echo "bytes to other hosts (per rank): $(cat "$work"/h*.out | sed -n 's/^\[rank \([0-9]*\)\] plane [a-z]* \([0-9]*\)$/\1:\2/p' | sort | tr '\n' ' ')"
  fi
}

t0=$(date +%s)
case $scenario in
  torchrun)
    /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || skip "torch (python3-torch) is not installed: no torchrun"
    for ((i = 0; i < hosts; i++)); do
      {
        echo "127.0.0.1 localhost"
        for ((j = 0; j < hosts; j++)); do
          if [ $j = $i ]; then echo "127.0.1.1 host$j"; else echo "10.231.0.$((j + 1)) host$j"; fi
        done
      } >"$work/hosts$i"
    done
    printf '#!/bin/bash\necho "worker rank=$RANK MASTER_ADDR=$MASTER_ADDR"\nexec %s battery\n' \
      "$peers/dopt_collectives_peer" >"$work/worker.sh"
    chmod +x "$work/worker.sh"
    unset DOPT_JOB_ID  # torchrun's rendezvous id is the job id
    for ((i = 0; i < hosts; i++)); do
      in_host "$i" --hosts "$work/hosts$i" timeout 100 /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \
        --nnodes "$hosts" --nproc_per_node "$per" --rdzv_backend c10d --rdzv_endpoint "host0:$port" \
        --rdzv_id "mh-$$" --no_python "$work/worker.sh" >"$work/h$i.out" 2>"$work/h$i.err" &
      hpid[$i]=$!
      pids+=($!)
    done
    wait_hosts || fail "a host's torchrun failed"
    cat "$work"/h*.out "$work"/h*.err >"$work/all"
    for ((r = 0; r < per * hosts; r++)); do
      grep -q "worker rank=$r MASTER_ADDR=host0$" "$work/all" || fail "rank $r was not given MASTER_ADDR=host0"
      grep -Eq "(^|[] :])ok $r [0-9]+" "$work/all" || fail "rank $r did not finish"
    done
    [ "$(grep -c "the world group runs on the hier plane" "$work/all")" = $((per * hosts)) ] ||
      fail "not every rank ran on the hierarchical plane"
    echo "MASTER_ADDR=host0 (127.0.1.1 on host 0, 10.231.0.1 on host 1): every rank ok, hierarchical plane"
    ;;
  battery | slow | ipv6 | portrange)
    env_extra=()
    if [ "$scenario" = slow ]; then
      for ((i = 0; i < hosts; i++)); do
        tc -n "${tag}h$i" qdisc add dev eth0 root handle 1: tbf rate 100mbit burst 64kb latency 100ms 2>"$work/err" ||
          skip "cannot limit a link with tc tbf: $(cat "$work/err")"
        # delay and loss too where the kernel has netem
        if tc -n "${tag}h$i" qdisc add dev eth0 parent 1:1 handle 10: netem delay 2ms loss 0.1% 2>"$work/err"; then
          echo "host $i: 100 Mbit/s, 2 ms delay, 0.1 % loss"
        else
          echo "host $i: 100 Mbit/s (no netem in this kernel: $(head -c 80 "$work/err"))"
        fi
      done
      # the default bounds: no spurious timeout at 100 Mbit/s
      unset DOPT_TIMEOUT_MS
    fi
    if [ "$scenario" = ipv6 ]; then
      master=fd00:231::1
      for ((i = 0; i < hosts; i++)); do ip -n "${tag}h$i" addr del "10.231.0.$((i + 1))/24" dev eth0; done
    fi
    if [ "$scenario" = portrange ]; then
      export DOPT_PORT_RANGE=30100-30103
      start_hosts -- "$peers/dopt_collectives_peer" loop
      # sample the listeners while the ranks run
      sleep 2
      for ((i = 0; i < hosts; i++)); do
        ip netns exec "${tag}h$i" ss -ltnH >"$work/ss$i" 2>/dev/null
        bad=$(awk '{n = split($4, a, ":"); p = a[n]; if (p != 29511 && (p < 30100 || p > 30103)) print p}' "$work/ss$i")
        [ -z "$bad" ] || fail "host $i: listeners outside DOPT_PORT_RANGE: $bad ($(tr '\n' ';' <"$work/ss$i"))"
        echo "host $i listens on: $(awk '{print $4}' "$work/ss$i" | tr '\n' ' ')"
      done
    else
      start_hosts -- "$peers/dopt_collectives_peer" battery
    fi
    wait_hosts || fail "a host failed"
    if [ "$scenario" = portrange ]; then expect_ok hier; else expect_ok hier crossed; fi
    ;;
  digest | digest1)
    # 2 x 1 with striped messages (machines with fewer than 4 CPUs, like
    # CI's, send whole ones by default), 2 x 2 with the default
    [ "$scenario" = digest1 ] && export DOPT_TCP_STRIPE_MIN=256K
    start_hosts -- "$peers/dopt_collectives_peer" digest
    wait_hosts || fail "a host failed"
    expect_ok hier crossed
    # the same ranks on one host (shared memory), in host 0's namespaces
    in_host 0 "$run" --nproc-per-node $((per * hosts)) --master-addr 127.0.0.1 --master-port 29512 \
      "$peers/dopt_collectives_peer" digest >"$work/one.out" 2>"$work/one.err" || { cat "$work/one.out" "$work/one.err"; fail "one host failed"; }
    grep -q "runs on the shm plane" "$work/one.err" || fail "the one-host run did not use shared memory"
    same_digests "" "$work/one.out"
    if [ "$scenario" = digest ]; then
      # 2 x 2: the large all_gathers read the host peer's memory (cross-memory
      # attach); again with DOPT_SHM_CMA=0 (staged through shared memory): the
      # same digests, nothing read
      cma=$(cat "$work"/h*.out | sed -n 's/^\[rank [0-9]*\] read from host peers \([0-9]*\)$/\1/p' | sort -n)
      echo "bytes read from host peers (per rank): $(echo $cma)"
      [ "$(echo "$cma" | wc -w)" = 4 ] && [ "$(echo "$cma" | head -n 1)" -gt 0 ] ||
        fail "a rank read nothing from its host peer's memory (the cross-memory all_gather was not taken)"
      cp "$work/one.out" "$work/one.keep"
      port=$((port + 7))
      DOPT_SHM_CMA=0 start_hosts -- "$peers/dopt_collectives_peer" digest
      wait_hosts || fail "a host failed with DOPT_SHM_CMA=0"
      same_digests ", DOPT_SHM_CMA=0" "$work/one.keep"
      cat "$work"/h*.out | grep -q "read from host peers [1-9]" && fail "DOPT_SHM_CMA=0, yet a rank read its host peer's memory"
      echo "DOPT_SHM_CMA=0: the same digests, nothing read from host peers"
      # host 0 cross-memory, host 1 staged: the hosts still meet (the same
      # messages either way)
      printf '#!/bin/sh\n[ "$(hostname)" = host1 ] && export DOPT_SHM_CMA=0\nexec "$@"\n' >"$work/mixed.sh"
      chmod +x "$work/mixed.sh"
      port=$((port + 7))
      start_hosts -- "$work/mixed.sh" "$peers/dopt_collectives_peer" digest
      wait_hosts || fail "a host failed with DOPT_SHM_CMA=0 on host 1 only"
      same_digests ", DOPT_SHM_CMA=0 on host 1" "$work/one.keep"
      grep -q "read from host peers [1-9]" "$work/h0.out" || fail "host 0 did not read its host peers' memory"
      grep -q "read from host peers [1-9]" "$work/h1.out" && fail "DOPT_SHM_CMA=0 on host 1, yet a rank there read its host peer's memory"
      echo "host 0 cross-memory, host 1 staged: the same digests"
    fi
    ;;
  zero)
    start_hosts -- "$peers/dopt_zero_peer" parity
    wait_hosts || fail "a host failed"
    expect_ok hier
    ;;
  plsgd)
    start_hosts -- "$peers/dopt_plsgd_peer" periodic
    wait_hosts || fail "a host failed"
    expect_ok hier
    ;;
  cut)
    export DOPT_TIMEOUT_MS=20000 DOPT_PEER_TIMEOUT_MS=3000
    # cut_link LOGPREFIX: waits until every rank runs, takes host 1's link down
    cut_link() {
      for ((k = 0; k < 200; k++)); do
        [ "$(cat "$work"/$1*.out 2>/dev/null | grep -c "cut: running")" -ge 4 ] && break
        sleep 0.1
      done
      sleep 1
      ip -n "${tag}sw" link set p1 down
      tcut=$(date +%s)
    }
    names_other_host() {  # LINE RANK
      if [ "$2" -lt 2 ]; then echo "$1" | grep -q "rank [23]"; else echo "$1" | grep -q "rank [01]"; fi
    }
    # 1. ranks started directly (no launcher that stops the others after the
    #    first failure): every rank must fail by itself, naming the other host
    for ((r = 0; r < 4; r++)); do
      in_host $((r / 2)) env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 MASTER_ADDR=$master \
        MASTER_PORT=$port "$peers/dopt_collectives_peer" cut >"$work/r$r.out" 2>"$work/r$r.err" &
      rpid[$r]=$!
      pids+=($!)
    done
    cut_link r
    echo "link of host 1 cut (ranks started directly)"
    for ((r = 0; r < 4; r++)); do
      if wait "${rpid[$r]}"; then fail "rank $r exited 0 after the link was cut"; fi
      line=$(grep "^error " "$work/r$r.out")
      echo "rank $r after $(($(date +%s) - tcut)) s: $line"
      names_other_host "$line" $r || fail "rank $r's error does not name a rank of the other host"
    done
    took=$(($(date +%s) - tcut))
    [ "$took" -le 30 ] || fail "the ranks took $took s to fail (bound: 20 s collective timeout + 10 s)"
    # 2. under dopt-run on each host: each dopt-run exits non-zero, its first
    #    failed rank names the other host
    ip -n "${tag}sw" link set p1 up
    port=$((port + 1))
    start_hosts -- "$peers/dopt_collectives_peer" cut
    cut_link h
    echo "link of host 1 cut (dopt-run on each host)"
    for ((i = 0; i < hosts; i++)); do
      if wait "${hpid[$i]}"; then fail "host $i: dopt-run exited 0 after the link was cut"; fi
      line=$(grep "error " "$work/h$i.out" | head -n 1)
      echo "host $i: dopt-run exited non-zero after $(($(date +%s) - tcut)) s; $line"
      names_other_host "$line" $((2 * i)) || fail "host $i: the error does not name a rank of the other host"
    done
    took=$(($(date +%s) - tcut))
    [ "$took" -le 30 ] || fail "dopt-run took $took s to fail"
    ;;
  samename)
    start_hosts --same-name -- "$peers/dopt_collectives_peer" battery
    wait_hosts || fail "a host failed"
    expect_ok hier crossed
    export DOPT_TRANSPORT=tcp DOPT_BIND_ADDR=0.0.0.0
    port=29513
    start_hosts --same-name -- "$peers/dopt_collectives_peer" loop
    wait_hosts || fail "a host failed (DOPT_TRANSPORT=tcp, DOPT_BIND_ADDR=0.0.0.0)"
    expect_ok tcp
    ;;
  sharedshm)
    start_hosts --same-name --shared-shm -- "$peers/dopt_collectives_peer" battery
    wait_hosts || fail "a host failed"
    expect_ok shm
    ;;
  ipc)
    # two single-rank "hosts" in this machine's network, each its own IPC
    # namespace and /dev/shm
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        unshare --ipc --mount --propagation private bash -c 'mount -t tmpfs tmpfs /dev/shm; exec "$@"' _ \
        "$peers/dopt_collectives_peer" battery >"$work/h$r.out" 2>"$work/h$r.err" &
      hpid[$r]=$!
      pids+=($!)
    done
    wait_hosts || fail "a rank failed"
    for r in 0 1; do
      grep -q "^ok $r " "$work/h$r.out" || fail "rank $r did not finish"
      grep -q "runs on the hier plane" "$work/h$r.err" || fail "rank $r did not take the hierarchical plane"
    done
    ;;
  unreachable)
    export DOPT_HANDSHAKE_TIMEOUT_MS=3000
    # host 1's ranks advertise 10.231.9.9, which nobody has
    for ((i = 0; i < hosts; i++)); do
      adv=()
      [ "$i" = 1 ] && adv=(env DOPT_ADVERTISE_ADDR=${UNREACHABLE_ADDR:-10.231.9.9})
      in_host "$i" "${adv[@]}" "$run" --nproc-per-node 2 --nnodes "$hosts" --node-rank "$i" \
        --master-addr "$master" --master-port "$port" "$peers/dopt_collectives_peer" battery \
        >"$work/h$i.out" 2>"$work/h$i.err" &
      hpid[$i]=$!
      pids+=($!)
    done
    for ((i = 0; i < hosts; i++)); do
      if wait "${hpid[$i]}"; then fail "host $i: dopt-run exited 0 though host 1 advertised an unreachable address"; fi
    done
    took=$(($(date +%s) - t0))
    [ "$took" -le 40 ] || fail "the ranks took $took s to fail"
    # On each host the rank that failed first names the address. (dopt-run
    # then stops the host's other rank; when that is rank 0, which holds the
    # rendezvous, a rank elsewhere may only learn "rank 0 is gone".)
    for ((i = 0; i < hosts; i++)); do
      grep "error " "$work/h$i.out" | sed "s/^/host $i: /"
      grep "error " "$work/h$i.out" | grep -q "${UNREACHABLE_ADDR:-10.231.9.9}" ||
        fail "host $i: no error names the unreachable address"
    done
    ;;
  mpirun)
    command -v mpirun >/dev/null || skip "OpenMPI's mpirun is not installed"
    agent=$work/agent.sh
    # mpirun's rsh agent: "agent HOST CMD...": CMD in that host's namespaces
    cat >"$agent" <<EOF
#!/usr/bin/env bash
h=\$1; shift
i=\${h#host}
exec ip netns exec ${tag}h\$i unshare --uts --ipc --mount --propagation private \
  bash -c "hostname host\$i; mount -t tmpfs tmpfs /dev/shm; \$*"
EOF
    chmod +x "$agent"
    # mpirun in the switch namespace; its daemons and ranks in the hosts'
    mpi_run() {  # OUT ARGS...
      local out=$1
      shift
      ip netns exec "${tag}sw" timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 --host host0:2,host1:2 \
        --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include 10.231.0.0/24 --mca btl_tcp_if_include 10.231.0.0/24 \
        --mca btl self,vader,tcp -x MASTER_ADDR=10.231.0.1 -x MASTER_PORT=$port -x DOPT_DEBUG=1 -x DOPT_TIMEOUT_MS \
        -x DOPT_JOB_ID -x DOPT_SECRET_FILE -x PATH -x LD_LIBRARY_PATH "$@" >"$out" 2>&1
    }
    # 1. dopt's own planes under mpirun: the hierarchical plane
    mpi_run "$work/h0.out" "$peers/dopt_collectives_peer" battery || { cat "$work/h0.out"; fail "mpirun failed"; }
    for ((r = 0; r < 4; r++)); do grep -q "^ok $r " "$work/h0.out" || fail "rank $r did not finish"; done
    [ "$(grep -c "runs on the hier plane" "$work/h0.out")" = 4 ] || fail "not every rank ran on the hier plane"
    # 2. DOPT_BACKEND=mpi: every collective through MPI across the hosts, bit
    #    for bit the results of 4 ranks on one host's shared memory
    port=$((port + 1))
    mpi_run "$work/mpi.out" -x DOPT_BACKEND=mpi "$peers/dopt_collectives_peer" digest ||
      { cat "$work/mpi.out"; fail "mpirun (DOPT_BACKEND=mpi) failed"; }
    [ "$(grep -c "runs on the mpi plane" "$work/mpi.out")" = 4 ] || fail "not every rank ran on the mpi plane"
    grep "^plane mpi " "$work/mpi.out" | awk '$3 == 0 {exit 1}' || fail "a rank sent no bytes to the other host"
    echo "bytes to other hosts on the mpi plane: $(grep "^plane mpi " "$work/mpi.out" | awk '{print $3}' | tr '\n' ' ')"
    in_host 0 "$run" --nproc-per-node 4 --master-addr 127.0.0.1 --master-port 29512 \
      "$peers/dopt_collectives_peer" digest >"$work/one.out" 2>&1 || { cat "$work/one.out"; fail "one host failed"; }
    for ((r = 0; r < 4; r++)); do
      a=$(sed -n "s/^digest $r \([0-9a-f]*\)$/\1/p" "$work/mpi.out")
      b=$(sed -n "s/^\[rank $r\] digest $r \([0-9a-f]*\)$/\1/p" "$work/one.out")
      [ -n "$a" ] && [ "$a" = "$b" ] || fail "rank $r: digest on the mpi plane across hosts '$a' != on one host '$b'"
      echo "rank $r: digest $a over MPI across the hosts and on one host"
    done
    ;;
  *)
    echo "unknown scenario $scenario"
    exit 2
    ;;
esac
echo "passed: $scenario in $(($(date +%s) - t0)) s"
exit 0
